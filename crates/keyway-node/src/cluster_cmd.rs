//! `CLUSTER ...`: Redis Cluster's view of the partition map.
//!
//! Every reply is built from this node's copy of the map, so every node
//! that has the same map version answers the same. Adjacent hash partitions
//! with one owner are reported as one slot range, as Redis Cluster would.
//! The two that read keys, `COUNTKEYSINSLOT` and `GETKEYSINSLOT`, are data
//! commands on their slot instead: admitted and run on the slot's storage
//! thread like `GET` (so a node answers them only for a slot it owns and
//! serves now; another node's slot is `-MOVED`, as a key of it would be).

use crate::executor::{Follow, Task, TaskOutput};
use crate::node_cmd::{Reply, rejection_kind, storage_failure};
use crate::routing::Rejection;
use crate::server::Shared;
use bytes::Bytes;
use keyway_map::{
    DEFAULT_KEYSPACE, NodeId, NodeInfo, NodeState, PartitionMap, SLOT_COUNT, key_hash_slot,
};
use keyway_resp::Frame;
use keyway_storage::KeyRange;
use std::sync::Arc;

/// Answers `CLUSTER <subcommand> ...`.
pub async fn cluster(shared: &Arc<Shared>, args: &[Bytes]) -> Reply {
    let Some(sub) = args.get(1) else {
        return crate::cmd::table::arity_error("cluster").into();
    };
    let sub_upper = String::from_utf8_lossy(sub).to_ascii_uppercase();
    match sub_upper.as_str() {
        "COUNTKEYSINSLOT" if args.len() == 3 => {
            return match parse_slot(&args[2]) {
                Some(slot) => slot_read(shared, slot, SlotRead::Count).await,
                None => Frame::Error("ERR Invalid slot".into()).into(),
            };
        }
        "GETKEYSINSLOT" if args.len() == 4 => {
            let count = std::str::from_utf8(&args[3])
                .ok()
                .and_then(|s| s.parse::<usize>().ok());
            return match (parse_slot(&args[2]), count) {
                (Some(slot), Some(count)) => slot_read(shared, slot, SlotRead::Keys(count)).await,
                _ => Frame::Error("ERR Invalid slot or number of keys".into()).into(),
            };
        }
        _ => {}
    }
    map_reply(shared, args).into()
}

/// The replies built from the map alone.
fn map_reply(shared: &Arc<Shared>, args: &[Bytes]) -> Frame {
    let sub = &args[1];
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

/// A read of one slot's keys.
#[derive(Clone, Copy)]
enum SlotRead {
    /// `COUNTKEYSINSLOT`: how many.
    Count,
    /// `GETKEYSINSLOT`: at most this many names.
    Keys(usize),
}

/// Most key names one `GETKEYSINSLOT` returns, whatever its count says.
const MAX_KEYS_IN_SLOT: usize = 100_000;

/// Runs a slot read as a data command on that slot: on its storage thread,
/// in order with the connection's earlier commands on the slot, admitted
/// under the routing read guard (a lapsed lease refuses, a foreign slot is
/// `-MOVED`, a fenced one parks), its reply released after group commit.
async fn slot_read(shared: &Arc<Shared>, slot: u16, read: SlotRead) -> Reply {
    match shared
        .executor
        .submit(slot, slot_task(shared.clone(), slot, read))
        .await
    {
        Ok(rx) => Reply::Waiting(rx),
        Err(frame) => frame.into(),
    }
}

fn slot_task(shared: Arc<Shared>, slot: u16, read: SlotRead) -> Task {
    Box::new(move |engine| {
        let guard = shared.routing.read();
        match guard.admit_slot(DEFAULT_KEYSPACE, slot, None) {
            Ok(_) => {}
            Err(Rejection::Fenced { .. }) => {
                drop(guard);
                return TaskOutput {
                    reply: Frame::Null,
                    wrote: false,
                    follow: Follow::Park(slot_task(shared, slot, read)),
                };
            }
            Err(rejection) => {
                shared.metrics.rejected(rejection_kind(&rejection));
                return TaskOutput::reply(rejection.to_frame(), false);
            }
        }
        let range = slot_range(slot);
        let reply =
            match read {
                SlotRead::Count => engine
                    .range_stats(&range)
                    .map(|(keys, _bytes)| Frame::Integer(keys as i64)),
                SlotRead::Keys(0) => Ok(Frame::Array(vec![])),
                SlotRead::Keys(count) => engine
                    .scan(&range, None, count.min(MAX_KEYS_IN_SLOT))
                    .map(|chunk| {
                        Frame::Array(
                            chunk
                                .entries
                                .into_iter()
                                .filter_map(|(k, _)| {
                                    k.get(6..)
                                        .map(|user| Frame::Bulk(Bytes::copy_from_slice(user)))
                                })
                                .collect(),
                        )
                    }),
            };
        match reply {
            Ok(frame) => TaskOutput::reply(frame, false),
            Err(e) => storage_failure(e),
        }
    })
}
