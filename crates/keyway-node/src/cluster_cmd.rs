//! `CLUSTER ...`: Redis Cluster's view of the partition map.
//!
//! Every reply is built from this node's copy of the map, so every node
//! that has the same map version answers the same. Adjacent hash partitions
//! with one owner are reported as one slot range, as Redis Cluster would.

use crate::server::Shared;
use bytes::Bytes;
use keyway_map::{
    DEFAULT_KEYSPACE, NodeId, NodeInfo, NodeState, PartitionMap, SLOT_COUNT, key_hash_slot,
};
use keyway_resp::Frame;
use keyway_storage::KeyRange;
use std::sync::Arc;

/// Answers `CLUSTER <subcommand> ...`.
pub async fn cluster(shared: &Arc<Shared>, args: &[Bytes]) -> Frame {
    let Some(sub) = args.get(1) else {
        return crate::cmd::table::arity_error("cluster");
    };
    let sub = String::from_utf8_lossy(sub).to_ascii_uppercase();
    let map = shared.routing.map();
    let arity = |n: usize| args.len() == n;
    match sub.as_str() {
        "SLOTS" if arity(2) => slots(&map),
        "SHARDS" if arity(2) => shards(&map),
        "NODES" if arity(2) => Frame::Bulk(Bytes::from(nodes(&map, shared.me))),
        "INFO" if arity(2) => info(&map, shared),
        "MYID" if arity(2) => Frame::bulk(shared.me.to_string()),
        "KEYSLOT" if arity(3) => Frame::Integer(key_hash_slot(&args[2]) as i64),
        "COUNTKEYSINSLOT" if arity(3) => match parse_slot(&args[2]) {
            Some(slot) => count_keys_in_slot(shared, slot).await,
            None => Frame::Error("ERR Invalid slot".into()),
        },
        "GETKEYSINSLOT" if arity(4) => {
            let count = std::str::from_utf8(&args[3])
                .ok()
                .and_then(|s| s.parse::<usize>().ok());
            match (parse_slot(&args[2]), count) {
                (Some(slot), Some(count)) => keys_in_slot(shared, slot, count).await,
                _ => Frame::Error("ERR Invalid slot or number of keys".into()),
            }
        }
        "SLOTS" | "SHARDS" | "NODES" | "INFO" | "MYID" | "KEYSLOT" | "COUNTKEYSINSLOT"
        | "GETKEYSINSLOT" => Frame::Error(format!(
            "ERR wrong number of arguments for 'cluster|{}' command",
            sub.to_lowercase()
        )),
        _ => Frame::Error(format!(
            "ERR unknown subcommand '{}'. Try CLUSTER HELP.",
            String::from_utf8_lossy(&args[1])
        )),
    }
}

fn parse_slot(arg: &[u8]) -> Option<u16> {
    std::str::from_utf8(arg)
        .ok()?
        .parse::<u16>()
        .ok()
        .filter(|s| *s < SLOT_COUNT)
}

/// Runs of `(first_slot, last_slot, owner)` over the default keyspace, merged
/// where neighbours share an owner.
pub fn slot_ranges(map: &PartitionMap) -> Vec<(u16, u16, NodeId)> {
    let mut out: Vec<(u16, u16, NodeId)> = Vec::new();
    for p in map.keyspace_partitions(DEFAULT_KEYSPACE) {
        let (first, last) = p.slot_span();
        match out.last_mut() {
            Some(run) if run.2 == p.owner && run.1 + 1 == first => run.1 = last,
            _ => out.push((first, last, p.owner)),
        }
    }
    out
}

fn node_entry(node: Option<&NodeInfo>, id: NodeId) -> Frame {
    let (host, port) = node.map(|n| n.resp_host_port()).unwrap_or(("", 0));
    Frame::Array(vec![
        Frame::bulk(host.to_string()),
        Frame::Integer(port as i64),
        Frame::bulk(id.to_string()),
        Frame::Map(vec![]),
    ])
}

fn slots(map: &PartitionMap) -> Frame {
    Frame::Array(
        slot_ranges(map)
            .into_iter()
            .map(|(first, last, owner)| {
                Frame::Array(vec![
                    Frame::Integer(first as i64),
                    Frame::Integer(last as i64),
                    node_entry(map.nodes.get(&owner), owner),
                ])
            })
            .collect(),
    )
}

fn shards(map: &PartitionMap) -> Frame {
    let ranges = slot_ranges(map);
    let shards = map.nodes.values().map(|n| {
        let slots = ranges
            .iter()
            .filter(|r| r.2 == n.id)
            .flat_map(|r| [Frame::Integer(r.0 as i64), Frame::Integer(r.1 as i64)])
            .collect();
        let (host, port) = n.resp_host_port();
        let health = if n.state == NodeState::Up {
            "online"
        } else {
            "failed"
        };
        let node = Frame::Map(vec![
            (Frame::bulk("id"), Frame::bulk(n.id.to_string())),
            (Frame::bulk("port"), Frame::Integer(port as i64)),
            (Frame::bulk("ip"), Frame::bulk(host.to_string())),
            (Frame::bulk("endpoint"), Frame::bulk(host.to_string())),
            (Frame::bulk("role"), Frame::bulk("master")),
            (Frame::bulk("replication-offset"), Frame::Integer(0)),
            (Frame::bulk("health"), Frame::bulk(health)),
        ]);
        Frame::Map(vec![
            (Frame::bulk("slots"), Frame::Array(slots)),
            (Frame::bulk("nodes"), Frame::Array(vec![node])),
        ])
    });
    Frame::Array(shards.collect())
}

/// The `CLUSTER NODES` text: one line per node, slot ranges at the end.
pub fn nodes(map: &PartitionMap, me: NodeId) -> String {
    let ranges = slot_ranges(map);
    let mut out = String::new();
    for n in map.nodes.values() {
        let (host, port) = n.resp_host_port();
        let mut flags = if n.id == me {
            "myself,master".to_string()
        } else {
            "master".to_string()
        };
        if n.state == NodeState::Down {
            flags.push_str(",fail");
        }
        let link = if n.state == NodeState::Up {
            "connected"
        } else {
            "disconnected"
        };
        out.push_str(&format!(
            "{} {host}:{port}@{} {flags} - 0 0 {} {link}",
            n.id,
            port as u32 + 10000,
            map.version
        ));
        for (first, last, _) in ranges.iter().filter(|r| r.2 == n.id) {
            if first == last {
                out.push_str(&format!(" {first}"));
            } else {
                out.push_str(&format!(" {first}-{last}"));
            }
        }
        out.push('\n');
    }
    out
}

fn info(map: &PartitionMap, shared: &Shared) -> Frame {
    let ranges = slot_ranges(map);
    let assigned: u32 = ranges.iter().map(|r| (r.1 - r.0) as u32 + 1).sum();
    let ok = assigned == SLOT_COUNT as u32 && shared.routing.lease_valid();
    let size = map
        .nodes
        .keys()
        .filter(|id| ranges.iter().any(|r| r.2 == **id))
        .count();
    let text = format!(
        "cluster_state:{}\r\ncluster_slots_assigned:{assigned}\r\ncluster_slots_ok:{assigned}\r\ncluster_slots_pfail:0\r\ncluster_slots_fail:0\r\ncluster_known_nodes:{}\r\ncluster_size:{size}\r\ncluster_current_epoch:{}\r\ncluster_my_epoch:{}\r\ncluster_stats_messages_sent:0\r\ncluster_stats_messages_received:0\r\ntotal_cluster_links_buffer_limit_exceeded:0\r\n",
        if ok { "ok" } else { "fail" },
        map.nodes.len(),
        map.version,
        map.version,
    );
    Frame::Verbatim {
        format: *b"txt",
        text: Bytes::from(text),
    }
}

/// The storage range holding one slot of the default keyspace.
pub fn slot_range(slot: u16) -> KeyRange {
    let ks = DEFAULT_KEYSPACE.0;
    let start = [&ks.to_be_bytes()[..], &slot.to_be_bytes()[..]].concat();
    let end = match slot + 1 {
        SLOT_COUNT => (ks + 1).to_be_bytes().to_vec(),
        next => [&ks.to_be_bytes()[..], &next.to_be_bytes()[..]].concat(),
    };
    KeyRange {
        start: Bytes::from(start),
        end: Some(Bytes::from(end)),
    }
}

async fn count_keys_in_slot(shared: &Arc<Shared>, slot: u16) -> Frame {
    let engine = shared.engine.clone();
    let range = slot_range(slot);
    match tokio::task::spawn_blocking(move || engine.range_stats(&range)).await {
        Ok(Ok((keys, _bytes))) => Frame::Integer(keys as i64),
        Ok(Err(e)) => Frame::Error(format!("ERR storage error: {e}")),
        Err(e) => Frame::Error(format!("ERR {e}")),
    }
}

async fn keys_in_slot(shared: &Arc<Shared>, slot: u16, count: usize) -> Frame {
    let engine = shared.engine.clone();
    let range = slot_range(slot);
    let limit = count.min(100_000);
    match tokio::task::spawn_blocking(move || engine.scan(&range, None, limit)).await {
        Ok(Ok(chunk)) => Frame::Array(
            chunk
                .entries
                .into_iter()
                .filter_map(|(k, _)| {
                    k.get(6..)
                        .map(|user| Frame::Bulk(Bytes::copy_from_slice(user)))
                })
                .collect(),
        ),
        Ok(Err(e)) => Frame::Error(format!("ERR storage error: {e}")),
        Err(e) => Frame::Error(format!("ERR {e}")),
    }
}
