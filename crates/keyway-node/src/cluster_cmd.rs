//! `CLUSTER ...`: Redis Cluster's view of the partition map.
//!
//! Every reply is built from this node's copy of the map, so every node
//! that has the same map version answers the same. Adjacent hash partitions
//! with one owner (and, where replicas are listed, one replica
//! configuration) are reported as one slot range, as Redis Cluster would.
//! Replicas are listed as Redis lists them: `SLOTS` after each range's
//! primary (only the in-sync ones, the only ones that serve `READONLY`
//! reads), `SHARDS` with their role and health, `NODES` as `slave` lines.
//! A node's two roles have two addresses and two ids
//! ([`crate::replica_endpoint`]): its main address and node id only ever
//! as a master, its replica endpoint and [`NodeId::replica_role_id`] only
//! ever as a replica; a copy on a node without a replica endpoint is not
//! listed (it serves no client reads). To a Redis client a Keyway node is
//! then one master process plus one replica process.
//! The two that read keys, `COUNTKEYSINSLOT` and `GETKEYSINSLOT`, are data
//! commands on their slot instead: admitted and run on the slot's storage
//! thread like `GET` (so a node answers them only for a slot it owns and
//! serves now; another node's slot is `-MOVED`, as a key of it would be).

use crate::executor::{Follow, Task, TaskOutput};
use crate::node_cmd::{Reply, rejection_kind, storage_failure};
use crate::routing::Rejection;
use crate::server::Shared;
use crate::session::Session;
use bytes::Bytes;
use keyway_map::{
    DEFAULT_KEYSPACE, NodeId, NodeInfo, NodeState, PartitionMap, SLOT_COUNT, key_hash_slot,
};
use keyway_resp::Frame;
use keyway_storage::KeyRange;
use std::sync::Arc;

/// Answers `CLUSTER <subcommand> ...` for `session`: if it sent `READONLY`
/// the slot reads may be served by an in-sync replica; on the replica
/// endpoint `MYID` and `NODES`' `myself` are the node's replica role.
pub async fn cluster(shared: &Arc<Shared>, args: &[Bytes], session: &Session) -> Reply {
    let readonly = session.readonly;
    let Some(sub) = args.get(1) else {
        return crate::cmd::table::arity_error("cluster").into();
    };
    let sub_upper = String::from_utf8_lossy(sub).to_ascii_uppercase();
    match sub_upper.as_str() {
        "COUNTKEYSINSLOT" if args.len() == 3 => {
            return match parse_slot(&args[2]) {
                Some(slot) => slot_read(shared, slot, SlotRead::Count, readonly).await,
                None => Frame::Error("ERR Invalid slot".into()).into(),
            };
        }
        "GETKEYSINSLOT" if args.len() == 4 => {
            let count = std::str::from_utf8(&args[3])
                .ok()
                .and_then(|s| s.parse::<usize>().ok());
            return match (parse_slot(&args[2]), count) {
                (Some(slot), Some(count)) => {
                    slot_read(shared, slot, SlotRead::Keys(count), readonly).await
                }
                _ => Frame::Error("ERR Invalid slot or number of keys".into()).into(),
            };
        }
        _ => {}
    }
    map_reply(shared, args, session.replica_endpoint).into()
}

/// The replies built from the map alone.
fn map_reply(shared: &Arc<Shared>, args: &[Bytes], replica_endpoint: bool) -> Frame {
    let me = Me {
        id: shared.me,
        replica_endpoint,
    };
    let sub = &args[1];
    let sub = String::from_utf8_lossy(sub).to_ascii_uppercase();
    let map = shared.routing.map();
    let arity = |n: usize| args.len() == n;
    match sub.as_str() {
        "SLOTS" if arity(2) => slots(&map),
        "SHARDS" if arity(2) => shards(&map),
        "NODES" if arity(2) => Frame::Bulk(Bytes::from(nodes(&map, me))),
        "INFO" if arity(2) => info(&map, shared),
        "MYID" if arity(2) => Frame::bulk(me.redis_id()),
        "REPLICAS" | "SLAVES" if arity(3) => replicas(&map, me, &args[2]),
        "KEYSLOT" if arity(3) => Frame::Integer(key_hash_slot(&args[2]) as i64),
        "SLOTS" | "SHARDS" | "NODES" | "INFO" | "MYID" | "KEYSLOT" | "COUNTKEYSINSLOT"
        | "GETKEYSINSLOT" | "REPLICAS" | "SLAVES" => Frame::Error(format!(
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

/// A run of adjacent slots of the default keyspace whose partitions have
/// the same primary and the same `replicas` (each listed with whether it
/// is in the in-sync set and Up, i.e. a read target).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicatedRun {
    pub first: u16,
    pub last: u16,
    pub owner: NodeId,
    /// `(replica, read target)` in the partition's placement order.
    pub replicas: Vec<(NodeId, bool)>,
}

impl ReplicatedRun {
    /// The replicas clients may send `READONLY` reads to: in the in-sync set
    /// and not Down (a replica out of sync answers them `-MOVED`, so it is
    /// not advertised; Redis likewise leaves out replicas that failed or
    /// have not synced).
    pub fn read_targets(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.replicas.iter().filter(|r| r.1).map(|r| r.0)
    }
}

/// The default keyspace's slots as runs of one primary and one replica
/// configuration (`CLUSTER SHARDS`; `CLUSTER SLOTS` lists the read targets).
pub fn replicated_runs(map: &PartitionMap) -> Vec<ReplicatedRun> {
    let up = |n: NodeId| map.nodes.get(&n).is_some_and(|n| n.state == NodeState::Up);
    let mut out: Vec<ReplicatedRun> = Vec::new();
    for p in map.keyspace_partitions(DEFAULT_KEYSPACE) {
        let (first, last) = p.slot_span();
        let replicas: Vec<(NodeId, bool)> = p
            .replicas
            .iter()
            .map(|r| (*r, p.is_in_sync_replica(*r) && up(*r)))
            .collect();
        match out.last_mut() {
            Some(run)
                if run.owner == p.owner && run.replicas == replicas && run.last + 1 == first =>
            {
                run.last = last
            }
            _ => out.push(ReplicatedRun {
                first,
                last,
                owner: p.owner,
                replicas,
            }),
        }
    }
    out
}

/// Who asks: this node, on its main address or on its replica endpoint.
#[derive(Clone, Copy, Debug)]
pub struct Me {
    pub id: NodeId,
    pub replica_endpoint: bool,
}

impl Me {
    /// `CLUSTER MYID`: the node id, or on the replica endpoint its replica
    /// role's id.
    pub fn redis_id(self) -> String {
        if self.replica_endpoint {
            self.id.replica_role_id()
        } else {
            self.id.to_string()
        }
    }
}

fn slot_node_entry(host: &str, port: u16, id: String) -> Frame {
    Frame::Array(vec![
        Frame::bulk(host.to_string()),
        Frame::Integer(port as i64),
        Frame::bulk(id),
        Frame::Map(vec![]),
    ])
}

/// A primary in `CLUSTER SLOTS`: its main address and node id.
fn node_entry(node: Option<&NodeInfo>, id: NodeId) -> Frame {
    let (host, port) = node.map(|n| n.resp_host_port()).unwrap_or(("", 0));
    slot_node_entry(host, port, id.to_string())
}

/// A replica in `CLUSTER SLOTS`: its replica endpoint and replica role id.
fn replica_entry(node: &NodeInfo) -> Option<Frame> {
    let (host, port) = node.replica_host_port()?;
    Some(slot_node_entry(host, port, node.id.replica_role_id()))
}

/// Whether `id` has a replica endpoint (only then are its copies listed).
fn has_endpoint(map: &PartitionMap, id: NodeId) -> bool {
    map.nodes.get(&id).is_some_and(|n| n.replica_addr.is_some())
}

/// `CLUSTER SLOTS`: per slot range `[first, last, primary, replica...]`,
/// each node `[host, port, id, {}]`: the primary at its main address, the
/// replicas (the range's read targets, [`ReplicatedRun::read_targets`],
/// that have a replica endpoint) at their replica endpoints with their
/// replica role ids. Ranges that differ only in a replica not listed
/// merge, so the reply is the same as Redis's for the same layout.
pub fn slots(map: &PartitionMap) -> Frame {
    let mut ranges: Vec<(u16, u16, NodeId, Vec<NodeId>)> = Vec::new();
    for run in replicated_runs(map) {
        let targets: Vec<NodeId> = run
            .read_targets()
            .filter(|r| has_endpoint(map, *r))
            .collect();
        match ranges.last_mut() {
            Some(r) if r.2 == run.owner && r.3 == targets && r.1 + 1 == run.first => r.1 = run.last,
            _ => ranges.push((run.first, run.last, run.owner, targets)),
        }
    }
    Frame::Array(
        ranges
            .into_iter()
            .map(|(first, last, owner, replicas)| {
                let mut entry = vec![
                    Frame::Integer(first as i64),
                    Frame::Integer(last as i64),
                    node_entry(map.nodes.get(&owner), owner),
                ];
                entry.extend(
                    replicas
                        .iter()
                        .filter_map(|r| map.nodes.get(r).and_then(replica_entry)),
                );
                Frame::Array(entry)
            })
            .collect(),
    )
}

/// A copy in `CLUSTER SHARDS`: a master at its main address with its node
/// id, a replica at its replica endpoint with its replica role id (`None`
/// without one). `health` with Redis's words: `fail` for a node marked
/// Down, `loading` for a replica not in the in-sync set (catching up; it
/// serves no reads), else `online`.
fn shard_node(node: &NodeInfo, role: &'static str, in_sync: bool) -> Option<Frame> {
    let (host, port, id) = if role == "master" {
        let (host, port) = node.resp_host_port();
        (host, port, node.id.to_string())
    } else {
        let (host, port) = node.replica_host_port()?;
        (host, port, node.id.replica_role_id())
    };
    let health = if node.state == NodeState::Down {
        "fail"
    } else if !in_sync {
        "loading"
    } else {
        "online"
    };
    Some(Frame::Map(vec![
        (Frame::bulk("id"), Frame::bulk(id)),
        (Frame::bulk("port"), Frame::Integer(port as i64)),
        (Frame::bulk("ip"), Frame::bulk(host.to_string())),
        (Frame::bulk("endpoint"), Frame::bulk(host.to_string())),
        (Frame::bulk("role"), Frame::bulk(role)),
        // Each copy's position in its primary's stream is known only to
        // that primary, not to every node answering from the map: 0, as
        // Redis reports for a node whose offset it does not know.
        (Frame::bulk("replication-offset"), Frame::Integer(0)),
        (Frame::bulk("health"), Frame::bulk(health)),
    ]))
}

/// `CLUSTER SHARDS`: one shard per primary and replica configuration
/// (owner, replicas, in-sync set), its slot ranges, its master then every
/// replica (`role` `replica`, `health` as [`shard_node`]). A node that owns
/// nothing appears (its master role) as a master shard with no slots, as
/// an empty Redis master does. A Keyway node's master role is master of
/// its shards, its replica role (its replica endpoint) a replica in others.
pub fn shards(map: &PartitionMap) -> Frame {
    /// One shard: its runs share `owner` and `replicas` (with read-target flags).
    struct Shard<'a> {
        owner: NodeId,
        replicas: &'a [(NodeId, bool)],
        slots: Vec<Frame>,
    }
    let runs = replicated_runs(map);
    let mut shards: Vec<Shard<'_>> = Vec::new();
    for run in &runs {
        let slots = [
            Frame::Integer(run.first as i64),
            Frame::Integer(run.last as i64),
        ];
        match shards
            .iter_mut()
            .find(|s| s.owner == run.owner && s.replicas == run.replicas.as_slice())
        {
            Some(s) => s.slots.extend(slots),
            None => shards.push(Shard {
                owner: run.owner,
                replicas: &run.replicas,
                slots: slots.to_vec(),
            }),
        }
    }
    for n in map.nodes.values() {
        if !runs.iter().any(|r| r.owner == n.id) {
            shards.push(Shard {
                owner: n.id,
                replicas: &[],
                slots: Vec::new(),
            });
        }
    }
    let shards = shards.into_iter().map(|shard| {
        let mut nodes: Vec<Frame> = map
            .nodes
            .get(&shard.owner)
            .and_then(|n| shard_node(n, "master", true))
            .into_iter()
            .collect();
        nodes.extend(shard.replicas.iter().filter_map(|(r, target)| {
            map.nodes
                .get(r)
                .and_then(|n| shard_node(n, "replica", *target))
        }));
        Frame::Map(vec![
            (Frame::bulk("slots"), Frame::Array(shard.slots)),
            (Frame::bulk("nodes"), Frame::Array(nodes)),
        ])
    });
    Frame::Array(shards.collect())
}

/// The primary the replica role of `id` names in `CLUSTER NODES`: the
/// owner of the first partition (by slot) it holds a copy of, if any.
/// Redis gives a replica one master; a Keyway node's replica role holds
/// copies of several primaries' ranges. redis-py and ioredis route by
/// `CLUSTER SLOTS`, which lists the replica role under every range it
/// serves, and do not use this field.
fn replica_master(map: &PartitionMap, id: NodeId) -> Option<NodeId> {
    map.keyspace_partitions(DEFAULT_KEYSPACE)
        .find(|p| p.replicas.contains(&id))
        .map(|p| p.owner)
}

fn link(n: &NodeInfo) -> (&'static str, &'static str) {
    match n.state {
        NodeState::Up => ("", "connected"),
        NodeState::Down => (",fail", "disconnected"),
    }
}

/// A node's master line: main address, node id, the slots it owns.
fn master_line(map: &PartitionMap, ranges: &[(u16, u16, NodeId)], n: &NodeInfo, me: Me) -> String {
    let (host, port) = n.resp_host_port();
    let myself = if n.id == me.id && !me.replica_endpoint {
        "myself,"
    } else {
        ""
    };
    let (fail, link) = link(n);
    let mut line = format!(
        "{} {host}:{port}@{} {myself}master{fail} - 0 0 {} {link}",
        n.id,
        port as u32 + 10000,
        map.version
    );
    for (first, last, _) in ranges.iter().filter(|r| r.2 == n.id) {
        if first == last {
            line.push_str(&format!(" {first}"));
        } else {
            line.push_str(&format!(" {first}-{last}"));
        }
    }
    line
}

/// A node's replica role's line: replica endpoint, replica role id,
/// `slave <master>` ([`replica_master`]); `None` without a replica
/// endpoint or a copy.
fn replica_line(map: &PartitionMap, n: &NodeInfo, me: Me) -> Option<String> {
    let (host, port) = n.replica_host_port()?;
    let master = replica_master(map, n.id)?;
    let myself = if n.id == me.id && me.replica_endpoint {
        "myself,"
    } else {
        ""
    };
    let (fail, link) = link(n);
    Some(format!(
        "{} {host}:{port}@{} {myself}slave{fail} {master} 0 0 {} {link}",
        n.id.replica_role_id(),
        port as u32 + 10000,
        map.version
    ))
}

/// The `CLUSTER NODES` text: a `master` line per node (its main address;
/// its slots, if it owns any), then a `slave` line per node's replica role
/// (its replica endpoint; see [`replica_line`]) that holds copies.
pub fn nodes(map: &PartitionMap, me: Me) -> String {
    let ranges = slot_ranges(map);
    let mut out = String::new();
    for n in map.nodes.values() {
        out.push_str(&master_line(map, &ranges, n, me));
        out.push('\n');
    }
    for line in map.nodes.values().filter_map(|n| replica_line(map, n, me)) {
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// `CLUSTER REPLICAS <node-id>` (and `SLAVES`): the `slave` lines of the
/// replica roles that are in-sync replicas of a partition `master` owns
/// (a replica role id is not a master: an error, as Redis answers).
pub fn replicas(map: &PartitionMap, me: Me, master: &[u8]) -> Frame {
    let text = String::from_utf8_lossy(master);
    if NodeId::parse_replica_role_id(&text).is_some_and(|id| has_endpoint(map, id)) {
        return Frame::Error("ERR The specified node is not a master".into());
    }
    let Some(m) = map.nodes.values().find(|n| n.id.to_string() == text) else {
        return Frame::Error(format!("ERR Unknown node {text}"));
    };
    let of_master: Vec<NodeId> = map
        .keyspace_partitions(DEFAULT_KEYSPACE)
        .filter(|p| p.owner == m.id)
        .flat_map(|p| p.in_sync.iter().copied())
        .collect();
    Frame::Array(
        map.nodes
            .values()
            .filter(|n| of_master.contains(&n.id))
            .filter_map(|n| replica_line(map, n, me))
            .map(Frame::bulk)
            .collect(),
    )
}

/// Slots whose primary the manager marked Down (it holds no lease), or that
/// name a node the map does not know: unreachable until a failover promotes
/// a replica, so the cluster is not `ok` (Redis counts such slots as
/// `cluster_slots_fail`).
pub(crate) fn failed_slots(map: &PartitionMap) -> u32 {
    let down = |id: NodeId| {
        map.nodes
            .get(&id)
            .is_none_or(|n| n.state == keyway_map::NodeState::Down)
    };
    slot_ranges(map)
        .iter()
        .filter(|r| down(r.2))
        .map(|r| (r.1 - r.0) as u32 + 1)
        .sum()
}

fn info(map: &PartitionMap, shared: &Shared) -> Frame {
    let ranges = slot_ranges(map);
    let assigned: u32 = ranges.iter().map(|r| (r.1 - r.0) as u32 + 1).sum();
    let failed = failed_slots(map);
    let ok = assigned == SLOT_COUNT as u32 && failed == 0 && shared.routing.lease_valid();
    let size = map
        .nodes
        .keys()
        .filter(|id| ranges.iter().any(|r| r.2 == **id))
        .count();
    let text = format!(
        "cluster_state:{}\r\ncluster_slots_assigned:{assigned}\r\ncluster_slots_ok:{}\r\ncluster_slots_pfail:0\r\ncluster_slots_fail:{failed}\r\ncluster_known_nodes:{}\r\ncluster_size:{size}\r\ncluster_current_epoch:{}\r\ncluster_my_epoch:{}\r\ncluster_stats_messages_sent:0\r\ncluster_stats_messages_received:0\r\ntotal_cluster_links_buffer_limit_exceeded:0\r\n",
        if ok { "ok" } else { "fail" },
        assigned - failed,
        map.nodes.len()
            + map
                .nodes
                .values()
                .filter(|n| n.replica_addr.is_some() && replica_master(map, n.id).is_some())
                .count(),
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
async fn slot_read(shared: &Arc<Shared>, slot: u16, read: SlotRead, readonly: bool) -> Reply {
    match shared
        .executor
        .submit(slot, slot_task(shared.clone(), slot, read, readonly))
        .await
    {
        Ok(rx) => Reply::Waiting(rx),
        Err(frame) => frame.into(),
    }
}

/// On a `READONLY` connection the read is admitted like a `GET` there
/// ([`crate::routing::RoutingGuard::admit_replica_read`]).
fn slot_task(shared: Arc<Shared>, slot: u16, read: SlotRead, readonly: bool) -> Task {
    Box::new(move |engine| {
        let guard = shared.routing.read();
        let admitted = if readonly {
            guard.admit_replica_read(DEFAULT_KEYSPACE, slot)
        } else {
            guard.admit_slot(DEFAULT_KEYSPACE, slot, None)
        };
        match admitted {
            Ok(p) => {
                if p.owner != shared.me {
                    shared.metrics.replica_read(true);
                }
            }
            Err(Rejection::Fenced { .. }) => {
                drop(guard);
                return TaskOutput {
                    reply: Frame::Null,
                    wrote: false,
                    follow: Follow::Park(slot_task(shared, slot, read, readonly)),
                };
            }
            Err(rejection) => {
                if readonly && matches!(rejection, Rejection::Moved { .. }) {
                    shared.metrics.replica_read(false);
                }
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
                                .filter(|(_, v)| v.kind.is_user_key())
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

#[cfg(test)]
#[path = "cluster_cmd_tests.rs"]
mod tests;
