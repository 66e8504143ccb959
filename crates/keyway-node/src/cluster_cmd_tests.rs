//! The `CLUSTER SLOTS` / `SHARDS` / `NODES` / `REPLICAS` builders on
//! replicated maps, in Redis 7.0's formats.

use super::*;
use keyway_map::{Epoch, NodeInfo, PartitionId};

fn node_infos(n: u64) -> Vec<NodeInfo> {
    (1..=n)
        .map(|i| NodeInfo {
            id: NodeId(i),
            resp_addr: format!("127.0.0.1:{}", 7000 + i),
            admin_addr: String::new(),
            state: NodeState::Up,
            weight: keyway_map::DEFAULT_NODE_WEIGHT,
            draining: false,
            zone: None,
        })
        .collect()
}

/// 3 nodes, one partition each, RF 2: p1 = node 1 (+2), p2 = node 2 (+3),
/// p3 = node 3 (+1).
fn rf2() -> PartitionMap {
    PartitionMap::bootstrap_replicated(&node_infos(3), 1, 2).unwrap()
}

fn entry(i: u64) -> Frame {
    Frame::Array(vec![
        Frame::bulk("127.0.0.1"),
        Frame::Integer(7000 + i as i64),
        Frame::bulk(NodeId(i).to_string()),
        Frame::Map(vec![]),
    ])
}

fn range(first: i64, last: i64, nodes: &[u64]) -> Frame {
    let mut v = vec![Frame::Integer(first), Frame::Integer(last)];
    v.extend(nodes.iter().map(|n| entry(*n)));
    Frame::Array(v)
}

fn pid_at(map: &PartitionMap, slot: u16) -> PartitionId {
    map.locate_slot(DEFAULT_KEYSPACE, slot).unwrap().id
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
    let s = |a: &str| a.to_string();
    assert_eq!(
        map_get(&shards[0], "slots"),
        &Frame::Array(vec![Frame::Integer(0), Frame::Integer(5460)])
    );
    assert_eq!(
        shard_nodes(&shards[0]),
        vec![
            (id(1), s("master"), s("fail")),
            (id(2), s("replica"), s("loading")),
        ]
    );
    assert_eq!(
        shard_nodes(&shards[1]),
        vec![
            (id(2), s("master"), s("online")),
            (id(3), s("replica"), s("online")),
        ]
    );
    // Node 1 is Down: a failed replica, whatever the in-sync set says.
    assert_eq!(
        shard_nodes(&shards[2]),
        vec![
            (id(3), s("master"), s("online")),
            (id(1), s("replica"), s("fail")),
        ]
    );
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
fn nodes_mark_mixed_nodes_master_and_replica_only_nodes_slave() {
    let map = rf2();
    let text = nodes(&map, NodeId(2));
    let lines: Vec<&str> = text.lines().collect();
    let v = map.version;
    assert_eq!(
        lines,
        vec![
            format!(
                "{} 127.0.0.1:7001@17001 master - 0 0 {v} connected 0-5460",
                NodeId(1)
            ),
            format!(
                "{} 127.0.0.1:7002@17002 myself,master - 0 0 {v} connected 5461-10921",
                NodeId(2)
            ),
            format!(
                "{} 127.0.0.1:7003@17003 master - 0 0 {v} connected 10922-16383",
                NodeId(3)
            ),
        ]
    );
    let map = node2_owns_nothing();
    let text = nodes(&map, NodeId(2));
    let lines: Vec<&str> = text.lines().collect();
    let v = map.version;
    assert_eq!(
        lines[0],
        format!(
            "{} 127.0.0.1:7001@17001 master - 0 0 {v} connected 0-10921",
            NodeId(1)
        )
    );
    assert_eq!(
        lines[1],
        format!(
            "{} 127.0.0.1:7002@17002 myself,slave {} 0 0 {v} connected",
            NodeId(2),
            NodeId(1)
        )
    );
}

#[test]
fn shards_list_a_replica_only_node_in_its_shards_and_an_idle_node_alone() {
    let mut map = node2_owns_nothing();
    let id = |i: u64| NodeId(i).to_string();
    let s = |a: &str| a.to_string();
    let Frame::Array(all) = shards(&map) else {
        panic!()
    };
    assert_eq!(all.len(), 2, "node 1's shard and node 3's: {all:?}");
    assert_eq!(
        shard_nodes(&all[0]),
        vec![
            (id(1), s("master"), s("online")),
            (id(2), s("replica"), s("online")),
        ]
    );
    // A fourth node with no copy: an empty master shard, as in Redis.
    let extra = node_infos(4).pop().unwrap();
    map.nodes.insert(NodeId(4), extra);
    let Frame::Array(all) = shards(&map) else {
        panic!()
    };
    assert_eq!(all.len(), 3);
    assert_eq!(map_get(&all[2], "slots"), &Frame::Array(vec![]));
    assert_eq!(
        shard_nodes(&all[2]),
        vec![(id(4), s("master"), s("online"))]
    );
}

#[test]
fn replicas_lists_the_in_sync_copies_of_a_masters_partitions() {
    let map = node2_owns_nothing();
    let id = |i: u64| NodeId(i).to_string();
    let ranges = slot_ranges(&map);
    let line = |i: u64| node_line(&map, &ranges, &map.nodes[&NodeId(i)], NodeId(3));
    assert_eq!(
        replicas(&map, NodeId(3), id(1).as_bytes()),
        Frame::Array(vec![Frame::bulk(line(2))])
    );
    // Node 3's partition is replicated on node 1 (a master itself).
    assert_eq!(
        replicas(&map, NodeId(3), id(3).as_bytes()),
        Frame::Array(vec![Frame::bulk(line(1))])
    );
    assert_eq!(
        replicas(&map, NodeId(3), id(2).as_bytes()),
        Frame::Error("ERR The specified node is not a master".into())
    );
    assert_eq!(
        replicas(&map, NodeId(3), b"nope"),
        Frame::Error("ERR Unknown node nope".into())
    );
}
