//! The `CLUSTER SLOTS` / `SHARDS` / `NODES` / `REPLICAS` builders on
//! replicated maps, in Redis 7.0's formats. Node `i` has its main address
//! at port `7000 + i` and its replica endpoint at `7100 + i`.

use super::*;
use keyway_map::{Epoch, NodeInfo, PartitionId};

fn node_infos(n: u64) -> Vec<NodeInfo> {
    (1..=n)
        .map(|i| NodeInfo {
            replica_addr: Some(format!("127.0.0.1:{}", 7100 + i)),
            ..NodeInfo::up(NodeId(i), format!("127.0.0.1:{}", 7000 + i))
        })
        .collect()
}

/// Node `i` at its main address (a primary).
fn main_at(i: u64) -> (String, i64, String) {
    ("127.0.0.1".into(), 7000 + i as i64, NodeId(i).to_string())
}

/// Node `i`'s replica role at its replica endpoint.
fn replica_at(i: u64) -> (String, i64, String) {
    (
        "127.0.0.1".into(),
        7100 + i as i64,
        NodeId(i).replica_role_id(),
    )
}

const MAIN: Me = Me {
    id: NodeId(2),
    replica_endpoint: false,
};
const ON_REPLICA: Me = Me {
    id: NodeId(2),
    replica_endpoint: true,
};

/// `(host, port, id)` of every node of every `CLUSTER SLOTS` range.
fn slot_nodes(reply: &Frame) -> Vec<Vec<(String, i64, String)>> {
    let Frame::Array(ranges) = reply else {
        panic!("{reply:?}")
    };
    ranges
        .iter()
        .map(|r| {
            let Frame::Array(items) = r else { panic!() };
            items[2..]
                .iter()
                .map(|n| match n {
                    Frame::Array(f) => match (&f[0], &f[1], &f[2]) {
                        (Frame::Bulk(h), Frame::Integer(p), Frame::Bulk(id)) => (
                            String::from_utf8_lossy(h).into_owned(),
                            *p,
                            String::from_utf8_lossy(id).into_owned(),
                        ),
                        other => panic!("{other:?}"),
                    },
                    other => panic!("{other:?}"),
                })
                .collect()
        })
        .collect()
}

/// The role redis-py 6 gives each address: that of its first appearance
/// in `CLUSTER SLOTS` (`NodesManager.initialize`), in first-seen order.
fn redis_py_roles(reply: &Frame) -> Vec<((String, i64), &'static str)> {
    let mut roles: Vec<((String, i64), &'static str)> = Vec::new();
    for range in slot_nodes(reply) {
        for (i, (host, port, _)) in range.into_iter().enumerate() {
            let addr = (host, port);
            if !roles.iter().any(|(a, _)| *a == addr) {
                roles.push((addr, if i == 0 { "primary" } else { "replica" }));
            }
        }
    }
    roles
}

/// 3 nodes, one partition each, RF 2: p1 = node 1 (+2), p2 = node 2 (+3),
/// p3 = node 3 (+1).
fn rf2() -> PartitionMap {
    PartitionMap::bootstrap_replicated(&node_infos(3), 1, 2).unwrap()
}

fn entry((host, port, id): (String, i64, String)) -> Frame {
    Frame::Array(vec![
        Frame::bulk(host),
        Frame::Integer(port),
        Frame::bulk(id),
        Frame::Map(vec![]),
    ])
}

/// A `CLUSTER SLOTS` range: `nodes[0]` the primary, the rest its replicas.
fn range(first: i64, last: i64, nodes: &[u64]) -> Frame {
    let mut v = vec![Frame::Integer(first), Frame::Integer(last)];
    v.extend(
        nodes
            .iter()
            .enumerate()
            .map(|(i, n)| entry(if i == 0 { main_at(*n) } else { replica_at(*n) })),
    );
    Frame::Array(v)
}

fn pid_at(map: &PartitionMap, slot: u16) -> PartitionId {
    map.locate_slot(DEFAULT_KEYSPACE, slot).unwrap().id
}

/// The fault the replica endpoint fixes: with every node primary of one
/// range and replica of another, redis-py must see every node's main
/// address as a primary (else `scan_iter`, `FLUSHALL`, `DBSIZE` to all
/// primaries skip it) and every replica at an address of its own.
#[test]
fn slots_show_every_node_as_a_primary_when_each_is_also_a_replica() {
    let map = rf2();
    let roles = redis_py_roles(&slots(&map));
    let primaries: Vec<i64> = roles
        .iter()
        .filter(|(_, r)| *r == "primary")
        .map(|((_, p), _)| *p)
        .collect();
    assert_eq!(primaries, vec![7001, 7002, 7003], "{roles:?}");
    let replicas: Vec<i64> = roles
        .iter()
        .filter(|(_, r)| *r == "replica")
        .map(|((_, p), _)| *p)
        .collect();
    assert_eq!(replicas, vec![7102, 7103, 7101], "{roles:?}");
    // No address is both (the main address is never listed as a replica).
    for range in slot_nodes(&slots(&map)) {
        for (_, port, id) in &range[1..] {
            assert!(*port > 7100, "{range:?}");
            assert!(NodeId::parse_replica_role_id(id).is_some(), "{id}");
        }
    }
}

#[test]
fn a_copy_on_a_node_without_a_replica_endpoint_is_not_listed() {
    let mut map = rf2();
    map.nodes.get_mut(&NodeId(2)).unwrap().replica_addr = None;
    assert_eq!(
        slots(&map),
        Frame::Array(vec![
            range(0, 5460, &[1]),
            range(5461, 10921, &[2, 3]),
            range(10922, 16383, &[3, 1]),
        ])
    );
    let text = nodes(&map, MAIN);
    assert!(!text.contains(&NodeId(2).replica_role_id()), "{text}");
}

#[test]
fn slots_list_each_primary_then_its_in_sync_replicas() {
    let mut map = rf2();
    assert_eq!(
        slots(&map),
        Frame::Array(vec![
            range(0, 5460, &[1, 2]),
            range(5461, 10921, &[2, 3]),
            range(10922, 16383, &[3, 1]),
        ])
    );
    // A replica out of the in-sync set, or Down, is no read target.
    let p1 = pid_at(&map, 0);
    map.partitions.get_mut(&p1).unwrap().in_sync.clear();
    map.nodes.get_mut(&NodeId(3)).unwrap().state = NodeState::Down;
    assert_eq!(
        slots(&map),
        Frame::Array(vec![
            range(0, 5460, &[1]),
            range(5461, 10921, &[2]),
            range(10922, 16383, &[3, 1]),
        ])
    );
}

#[test]
fn slots_merge_neighbours_only_with_the_same_read_targets() {
    // 2 partitions per node: node 1 owns slots 0..=5460 as two partitions.
    let mut map = PartitionMap::bootstrap_replicated(&node_infos(3), 2, 2).unwrap();
    let first = slots(&map);
    let Frame::Array(ranges) = &first else {
        panic!("{first:?}")
    };
    assert_eq!(ranges.len(), 3, "{first:?}");
    assert_eq!(ranges[0], range(0, 5460, &[1, 2]));
    // The second half of node 1's slots loses its in-sync replica.
    let p = pid_at(&map, 5460);
    let (split, _) = map.partitions[&p].slot_span();
    map.partitions.get_mut(&p).unwrap().in_sync.clear();
    let Frame::Array(ranges) = slots(&map) else {
        panic!()
    };
    assert_eq!(ranges.len(), 4);
    assert_eq!(ranges[0], range(0, split as i64 - 1, &[1, 2]));
    assert_eq!(ranges[1], range(split as i64, 5460, &[1]));
}

fn map_get<'a>(frame: &'a Frame, key: &str) -> &'a Frame {
    let Frame::Map(pairs) = frame else {
        panic!("not a map: {frame:?}")
    };
    pairs
        .iter()
        .find(|(k, _)| *k == Frame::bulk(key.to_string()))
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("no {key} in {frame:?}"))
}

fn shard_nodes(shard: &Frame) -> Vec<(String, String, String)> {
    let Frame::Array(nodes) = map_get(shard, "nodes") else {
        panic!()
    };
    nodes
        .iter()
        .map(|n| {
            let text = |k| match map_get(n, k) {
                Frame::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
                other => panic!("{other:?}"),
            };
            (text("id"), text("role"), text("health"))
        })
        .collect()
}

#[test]
fn shards_give_each_replica_its_role_and_health() {
    let mut map = rf2();
    let p1 = pid_at(&map, 0);
    map.partitions.get_mut(&p1).unwrap().in_sync.clear();
    map.nodes.get_mut(&NodeId(1)).unwrap().state = NodeState::Down;
    let Frame::Array(shards) = shards(&map) else {
        panic!()
    };
    assert_eq!(shards.len(), 3);
    let id = |i: u64| NodeId(i).to_string();
    let rid = |i: u64| NodeId(i).replica_role_id();
    let s = |a: &str| a.to_string();
    assert_eq!(
        map_get(&shards[0], "slots"),
        &Frame::Array(vec![Frame::Integer(0), Frame::Integer(5460)])
    );
    assert_eq!(
        shard_nodes(&shards[0]),
        vec![
            (id(1), s("master"), s("fail")),
            (rid(2), s("replica"), s("loading")),
        ]
    );
    assert_eq!(
        shard_nodes(&shards[1]),
        vec![
            (id(2), s("master"), s("online")),
            (rid(3), s("replica"), s("online")),
        ]
    );
    // Node 1 is Down: a failed replica, whatever the in-sync set says.
    assert_eq!(
        shard_nodes(&shards[2]),
        vec![
            (id(3), s("master"), s("online")),
            (rid(1), s("replica"), s("fail")),
        ]
    );
    // The replica is at its replica endpoint.
    let Frame::Array(nodes) = map_get(&shards[1], "nodes") else {
        panic!()
    };
    assert_eq!(map_get(&nodes[0], "port"), &Frame::Integer(7002));
    assert_eq!(map_get(&nodes[1], "port"), &Frame::Integer(7103));
    let Frame::Map(fields) = &shards[1] else {
        panic!()
    };
    let Frame::Array(nodes) = &fields[1].1 else {
        panic!()
    };
    let Frame::Map(node) = &nodes[1] else {
        panic!()
    };
    let keys: Vec<Frame> = node.iter().map(|(k, _)| k.clone()).collect();
    assert_eq!(
        keys,
        [
            "id",
            "port",
            "ip",
            "endpoint",
            "role",
            "replication-offset",
            "health"
        ]
        .map(Frame::bulk)
        .to_vec(),
        "Redis 7.0's field order"
    );
}

/// Node 2 hands its partition to node 1 and keeps a replica of both of
/// node 1's partitions: it owns nothing.
fn node2_owns_nothing() -> PartitionMap {
    let mut map = PartitionMap::bootstrap_replicated(&node_infos(3), 1, 2).unwrap();
    let p2 = pid_at(&map, 6000);
    let row = map.partitions.get_mut(&p2).unwrap();
    row.owner = NodeId(1);
    row.replicas = vec![NodeId(2)];
    row.in_sync = vec![NodeId(2)];
    row.epoch = Epoch(row.epoch.0 + 1);
    map.validate().unwrap();
    map
}

#[test]
fn nodes_list_a_master_line_per_node_and_a_slave_line_per_replica_role() {
    let map = rf2();
    let v = map.version;
    let masters = |me2: &str| {
        vec![
            format!(
                "{} 127.0.0.1:7001@17001 master - 0 0 {v} connected 0-5460",
                NodeId(1)
            ),
            format!(
                "{} 127.0.0.1:7002@17002 {me2}master - 0 0 {v} connected 5461-10921",
                NodeId(2)
            ),
            format!(
                "{} 127.0.0.1:7003@17003 master - 0 0 {v} connected 10922-16383",
                NodeId(3)
            ),
        ]
    };
    // Node i's replica role replicates the range of node i - 1 (ring order).
    let slaves = |me2: &str| {
        vec![
            format!(
                "{} 127.0.0.1:7101@17101 slave {} 0 0 {v} connected",
                NodeId(1).replica_role_id(),
                NodeId(3)
            ),
            format!(
                "{} 127.0.0.1:7102@17102 {me2}slave {} 0 0 {v} connected",
                NodeId(2).replica_role_id(),
                NodeId(1)
            ),
            format!(
                "{} 127.0.0.1:7103@17103 slave {} 0 0 {v} connected",
                NodeId(3).replica_role_id(),
                NodeId(2)
            ),
        ]
    };
    let text = nodes(&map, MAIN);
    let lines: Vec<String> = text.lines().map(str::to_string).collect();
    assert_eq!(lines, [masters("myself,"), slaves("")].concat());
    // On the replica endpoint `myself` is the replica role's line.
    let text = nodes(&map, ON_REPLICA);
    let lines: Vec<String> = text.lines().map(str::to_string).collect();
    assert_eq!(lines, [masters(""), slaves("myself,")].concat());
    assert_eq!(MAIN.redis_id(), NodeId(2).to_string());
    assert_eq!(ON_REPLICA.redis_id(), NodeId(2).replica_role_id());
}

#[test]
fn a_node_owning_nothing_is_an_empty_master_and_its_replica_role_a_slave() {
    let map = node2_owns_nothing();
    let text = nodes(&map, MAIN);
    let lines: Vec<&str> = text.lines().collect();
    let v = map.version;
    assert_eq!(
        lines[1],
        format!(
            "{} 127.0.0.1:7002@17002 myself,master - 0 0 {v} connected",
            NodeId(2)
        )
    );
    assert!(
        lines.contains(&&*format!(
            "{} 127.0.0.1:7102@17102 slave {} 0 0 {v} connected",
            NodeId(2).replica_role_id(),
            NodeId(1)
        )),
        "{text}"
    );
}

#[test]
fn shards_list_a_replica_role_in_its_shards_and_an_owner_of_nothing_alone() {
    let mut map = node2_owns_nothing();
    let id = |i: u64| NodeId(i).to_string();
    let s = |a: &str| a.to_string();
    let Frame::Array(all) = shards(&map) else {
        panic!()
    };
    assert_eq!(
        all.len(),
        3,
        "node 1's shard, node 3's, node 2 empty: {all:?}"
    );
    assert_eq!(
        shard_nodes(&all[0]),
        vec![
            (id(1), s("master"), s("online")),
            (NodeId(2).replica_role_id(), s("replica"), s("online")),
        ]
    );
    assert_eq!(map_get(&all[2], "slots"), &Frame::Array(vec![]));
    assert_eq!(
        shard_nodes(&all[2]),
        vec![(id(2), s("master"), s("online"))]
    );
    // A fourth node with no copy: an empty master shard, as in Redis.
    let extra = node_infos(4).pop().unwrap();
    map.nodes.insert(NodeId(4), extra);
    let Frame::Array(all) = shards(&map) else {
        panic!()
    };
    assert_eq!(all.len(), 4);
    assert_eq!(map_get(&all[3], "slots"), &Frame::Array(vec![]));
    assert_eq!(
        shard_nodes(&all[3]),
        vec![(id(4), s("master"), s("online"))]
    );
}

#[test]
fn replicas_lists_the_in_sync_copies_of_a_masters_partitions() {
    let map = node2_owns_nothing();
    let id = |i: u64| NodeId(i).to_string();
    let line = |i: u64| replica_line(&map, &map.nodes[&NodeId(i)], MAIN).unwrap();
    assert_eq!(
        replicas(&map, MAIN, id(1).as_bytes()),
        Frame::Array(vec![Frame::bulk(line(2))])
    );
    // Node 3's partition is replicated on node 1 (a master itself).
    assert_eq!(
        replicas(&map, MAIN, id(3).as_bytes()),
        Frame::Array(vec![Frame::bulk(line(1))])
    );
    // Node 2's master role owns nothing: no replicas.
    assert_eq!(replicas(&map, MAIN, id(2).as_bytes()), Frame::Array(vec![]));
    assert_eq!(
        replicas(&map, MAIN, NodeId(2).replica_role_id().as_bytes()),
        Frame::Error("ERR The specified node is not a master".into())
    );
    assert_eq!(
        replicas(&map, MAIN, b"nope"),
        Frame::Error("ERR Unknown node nope".into())
    );
}

#[test]
fn slots_of_a_down_primary_count_as_failed_until_a_replica_is_promoted() {
    let mut map = rf2();
    assert_eq!(failed_slots(&map), 0);
    let owner = map
        .locate_slot(keyway_map::DEFAULT_KEYSPACE, 0)
        .unwrap()
        .owner;
    let owned: u32 = map
        .keyspace_partitions(keyway_map::DEFAULT_KEYSPACE)
        .filter(|p| p.owner == owner)
        .map(|p| {
            let (first, last) = p.slot_span();
            u32::from(last - first) + 1
        })
        .sum();
    map.nodes.get_mut(&owner).unwrap().state = keyway_map::NodeState::Down;
    assert_eq!(failed_slots(&map), owned);
    // A failover moves those partitions to their in-sync replicas.
    let moved: Vec<PartitionId> = map
        .keyspace_partitions(keyway_map::DEFAULT_KEYSPACE)
        .filter(|p| p.owner == owner)
        .map(|p| p.id)
        .collect();
    for id in moved {
        let p = map.partitions.get_mut(&id).unwrap();
        let to = p.in_sync[0];
        p.replicas = vec![owner];
        p.in_sync.clear();
        p.owner = to;
        p.epoch = Epoch(p.epoch.0 + 1);
    }
    map.reindex();
    assert_eq!(failed_slots(&map), 0);
}
