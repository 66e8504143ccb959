//! `READONLY` reads on a replica, in-process: the replica serves a read only
//! while it is in the partition's in-sync set at its map's epoch and holds
//! a read lease for that epoch (invariant 11); anything else, and every
//! write, is `-MOVED` to the primary. The reads go to the node's replica
//! endpoint (`--replica-listen`, on by default), whose connections start
//! `READONLY` and where every write is `-MOVED` to a primary's main address.
//!
//! The partition's primary here is a node registered in the map that does
//! not run, so no replication stream grants (or renews) a read lease: the
//! test grants it through `Routing::grant_replica_read` itself, and no
//! manager runs (nothing fails the absent primary over). The real-client
//! tests at the end (redis-py, ioredis) make a replica by moving a
//! partition's ownership in the map alone, so only the replica holds the
//! value read: a reply carrying it was served from the replica's copy.

use crate::common;

use common::replica::{bulk, commit, raw_command};
use keyway_cluster::{ClusterSpec, LocalCluster};
use keyway_map::{
    DEFAULT_KEYSPACE, Epoch, MapChange, NodeId, NodeInfo, NodeState, PartitionRecord, key_hash_slot,
};
use keyway_resp::Frame;
use keyway_testkit::eventually;
use std::time::{Duration, Instant};

fn info_field(info: &Frame, name: &str) -> Option<String> {
    let text = match info {
        Frame::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
        Frame::Verbatim { text, .. } => String::from_utf8_lossy(text).into_owned(),
        other => panic!("INFO answered {other:?}"),
    };
    text.split("\r\n")
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':').map(str::to_string))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_readonly_replica_reads_only_in_sync_with_a_read_lease() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = ClusterSpec::ephemeral(3, dir.path().to_path_buf());
    spec.node.lease_ttl_ms = 60_000;
    spec.manager = None;
    let c = LocalCluster::start(spec).await.expect("cluster starts");

    // The key's owner A holds its value (and an expiring neighbour in its slot).
    let key = "replica-read-key";
    let expiring = "{replica-read-key}e";
    let slot = key_hash_slot(key.as_bytes());
    let map = c.map().await.unwrap();
    let p0 = map.locate_slot(DEFAULT_KEYSPACE, slot).unwrap().clone();
    let at = (0..c.len())
        .find(|i| c.node(*i).unwrap().id() == p0.owner)
        .unwrap();
    let a = c.node(at).unwrap();
    let mut owner_conn = tokio::net::TcpStream::connect(a.resp_addr()).await.unwrap();
    assert_eq!(
        raw_command(&mut owner_conn, &["SET", key, "v1"]).await,
        Frame::ok()
    );
    let expire_ms = 400;
    assert_eq!(
        raw_command(
            &mut owner_conn,
            &["SET", expiring, "gone", "PX", &expire_ms.to_string()]
        )
        .await,
        Frame::ok()
    );
    let expires_at = Instant::now() + Duration::from_millis(expire_ms);

    // The partition moves (metadata only) to primary F, which does not run;
    // A keeps its copy as a replica, not yet in sync.
    let f = NodeInfo {
        id: NodeId(9_999),
        resp_addr: "127.0.0.1:1".into(),
        admin_addr: "127.0.0.1:1".into(),
        state: NodeState::Up,
        weight: keyway_map::DEFAULT_NODE_WEIGHT,
        draining: false,
        zone: None,
        replica_addr: None,
    };
    let moved = Frame::Error(format!("MOVED {slot} 127.0.0.1:1"));
    let p1 = commit(
        &c,
        at,
        &p0,
        PartitionRecord {
            owner: f.id,
            replicas: vec![a.id()],
            in_sync: vec![],
            epoch: Epoch(p0.epoch.0 + 1),
            ..p0.clone()
        },
        vec![MapChange::UpsertNode(f.clone())],
    )
    .await;
    // The replica endpoint: READONLY without asking.
    let replica_addr = a.replica_addr().expect("a replica endpoint by default");
    let mut ro = tokio::net::TcpStream::connect(replica_addr).await.unwrap();
    // Not in sync: redirected, lease or not.
    a.shared().routing.grant_replica_read(
        p1.id,
        p1.epoch,
        Instant::now() + Duration::from_secs(60),
    );
    assert_eq!(raw_command(&mut ro, &["GET", key]).await, moved);

    // In sync at a new epoch: still no read lease for it.
    let p2 = commit(
        &c,
        at,
        &p1,
        PartitionRecord {
            in_sync: vec![a.id()],
            epoch: Epoch(p1.epoch.0 + 1),
            ..p1.clone()
        },
        vec![],
    )
    .await;
    assert_eq!(raw_command(&mut ro, &["GET", key]).await, moved);
    assert_eq!(a.shared().metrics.replica_reads_count(true), 0);
    assert_eq!(a.shared().metrics.replica_reads_count(false), 2);

    // The primary's read lease for this epoch: the replica serves reads.
    a.shared().routing.grant_replica_read(
        p2.id,
        p2.epoch,
        Instant::now() + Duration::from_secs(60),
    );
    assert_eq!(raw_command(&mut ro, &["GET", key]).await, bulk("v1"));
    assert_eq!(
        raw_command(&mut ro, &["MGET", key, "{replica-read-key}none"]).await,
        Frame::Array(vec![bulk("v1"), Frame::Null])
    );
    assert_eq!(
        raw_command(&mut ro, &["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()]).await,
        Frame::Integer(2)
    );
    assert_eq!(a.shared().metrics.replica_reads_count(true), 3);
    // ... but never a write: MOVED to the primary, the copy unchanged.
    assert_eq!(raw_command(&mut ro, &["SET", key, "v2"]).await, moved);
    assert_eq!(raw_command(&mut ro, &["GET", key]).await, bulk("v1"));
    // Not even of a partition A owns: MOVED to A's main address.
    let map = a.shared().routing.map();
    let (owned_slot, owned_key) = (0..10_000)
        .map(|i| format!("owned-{i}"))
        .map(|k| (key_hash_slot(k.as_bytes()), k))
        .find(|(s, _)| map.locate_slot(DEFAULT_KEYSPACE, *s).unwrap().owner == a.id())
        .expect("A owns some slot");
    assert_eq!(
        raw_command(&mut ro, &["SET", &owned_key, "x"]).await,
        Frame::Error(format!("MOVED {owned_slot} {}", a.resp_addr()))
    );
    let mut main = tokio::net::TcpStream::connect(a.resp_addr()).await.unwrap();
    assert_eq!(
        raw_command(&mut main, &["GET", &owned_key]).await,
        Frame::Null,
        "the write was not run"
    );
    assert_eq!(
        raw_command(&mut ro, &["KW.SET", &owned_key, "x"]).await,
        Frame::Error(
            "ERR this is the replica endpoint: send KW.* requests to the node's main address"
                .into()
        )
    );
    // A READONLY connection to the main address reads the copy too.
    assert_eq!(raw_command(&mut main, &["READONLY"]).await, Frame::ok());
    assert_eq!(raw_command(&mut main, &["GET", key]).await, bulk("v1"));
    assert_eq!(raw_command(&mut main, &["READWRITE"]).await, Frame::ok());
    // A connection without READONLY is redirected, as in Redis.
    let mut plain = tokio::net::TcpStream::connect(a.resp_addr()).await.unwrap();
    assert_eq!(raw_command(&mut plain, &["GET", key]).await, moved);

    // An expired key reads as absent on the replica, which leaves the
    // delete to its primary's stream: the copy still holds it.
    eventually("the key expires", Duration::from_secs(10), || {
        let past = Instant::now() > expires_at + Duration::from_millis(50);
        async move { past.then_some(()) }
    })
    .await;
    assert_eq!(raw_command(&mut ro, &["GET", expiring]).await, Frame::Null);
    let storage_key = a.shared().keyspace.storage_key(expiring.as_bytes());
    assert!(
        a.shared().engine.get(&storage_key).unwrap().is_some(),
        "a replica read deleted the expired key from the replica's copy"
    );

    // INFO and CLUSTER SLOTS tell the replica role.
    let info = raw_command(&mut ro, &["INFO"]).await;
    assert_eq!(
        info_field(&info, "keyway_replica_partitions_readable").as_deref(),
        Some("1")
    );
    assert_eq!(
        info_field(&info, "keyway_replica_reads").as_deref(),
        Some("6")
    );
    // The replica endpoint speaks for the replica role, the main address
    // for the master role.
    assert_eq!(info_field(&info, "role").as_deref(), Some("slave"));
    assert_eq!(info_field(&info, "master_port").as_deref(), Some("1"));
    let info = raw_command(&mut main, &["INFO"]).await;
    assert_eq!(info_field(&info, "role").as_deref(), Some("master"));
    assert_eq!(
        raw_command(&mut ro, &["CLUSTER", "MYID"]).await,
        bulk(&a.id().replica_role_id())
    );
    assert_eq!(
        raw_command(&mut main, &["CLUSTER", "MYID"]).await,
        bulk(&a.id().to_string())
    );
    // HELLO (RESP2: the map as a flat array) names the role too.
    let role_in_hello = |reply: Frame| match reply {
        Frame::Array(items) => items
            .chunks(2)
            .find(|kv| kv[0] == bulk("role"))
            .map(|kv| kv[1].clone()),
        other => panic!("HELLO answered {other:?}"),
    };
    assert_eq!(
        role_in_hello(raw_command(&mut ro, &["HELLO"]).await),
        Some(bulk("replica"))
    );
    assert_eq!(
        role_in_hello(raw_command(&mut main, &["HELLO"]).await),
        Some(bulk("master"))
    );
    let Frame::Array(ranges) = raw_command(&mut ro, &["CLUSTER", "SLOTS"]).await else {
        panic!("CLUSTER SLOTS is an array")
    };
    let range = ranges
        .iter()
        .find_map(|r| match r {
            Frame::Array(r)
                if matches!((&r[0], &r[1]), (Frame::Integer(lo), Frame::Integer(hi))
                    if *lo <= slot as i64 && slot as i64 <= *hi) =>
            {
                Some(r.clone())
            }
            _ => None,
        })
        .expect("the slot's range");
    assert_eq!(range.len(), 4, "primary and one replica: {range:?}");
    let port_id = |entry: &Frame| match entry {
        Frame::Array(e) => (e[1].clone(), e[2].clone()),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        port_id(&range[2]),
        (Frame::Integer(1), bulk(&f.id.to_string()))
    );
    // A is listed at its replica endpoint, under its replica role's id.
    let replica_port: i64 = replica_addr.rsplit_once(':').unwrap().1.parse().unwrap();
    assert_eq!(
        port_id(&range[3]),
        (
            Frame::Integer(replica_port),
            bulk(&a.id().replica_role_id())
        )
    );
    let Frame::Bulk(nodes) = raw_command(&mut ro, &["CLUSTER", "NODES"]).await else {
        panic!("CLUSTER NODES is a bulk string")
    };
    let nodes = String::from_utf8_lossy(&nodes).into_owned();
    let mine = nodes
        .lines()
        .find(|l| l.contains("myself"))
        .expect("a myself line");
    assert!(
        mine.starts_with(&format!(
            "{} {replica_addr}@{} myself,slave {}",
            a.id().replica_role_id(),
            replica_port + 10000,
            f.id
        )),
        "{nodes}"
    );

    // READWRITE ends it for the connection, even on the replica endpoint
    // (as on a Redis replica).
    assert_eq!(raw_command(&mut ro, &["READWRITE"]).await, Frame::ok());
    assert_eq!(raw_command(&mut ro, &["GET", key]).await, moved);
    assert_eq!(raw_command(&mut ro, &["READONLY"]).await, Frame::ok());
    assert_eq!(raw_command(&mut ro, &["GET", key]).await, bulk("v1"));

    // Out of the in-sync set at a newer epoch: the old lease is void.
    commit(
        &c,
        at,
        &p2,
        PartitionRecord {
            in_sync: vec![],
            epoch: Epoch(p2.epoch.0 + 1),
            ..p2.clone()
        },
        vec![],
    )
    .await;
    assert_eq!(raw_command(&mut ro, &["GET", key]).await, moved);
    c.shutdown().await;
}

/// Two nodes: node A wrote `key`, then (metadata only) the key's partition
/// moved to primary F, a node in the map that does not run (at
/// `primary_addr`), with A as its in-sync replica holding a read lease;
/// A still owns other partitions (it is a primary too). F serves nothing,
/// so a reply carrying the value was served by A's replica copy, and no
/// replication stream changes A's copy or lease meanwhile. Returns the
/// cluster (and its data directory) and A's index.
async fn replica_of_absent_primary(
    key: &str,
    primary_addr: &str,
) -> (tempfile::TempDir, LocalCluster, usize) {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = ClusterSpec::ephemeral(2, dir.path().to_path_buf());
    spec.node.lease_ttl_ms = 60_000;
    spec.manager = None;
    let c = LocalCluster::start(spec).await.expect("cluster starts");
    let slot = key_hash_slot(key.as_bytes());
    let p0 = c
        .map()
        .await
        .unwrap()
        .locate_slot(DEFAULT_KEYSPACE, slot)
        .unwrap()
        .clone();
    let a = (0..2)
        .find(|i| c.node(*i).unwrap().id() == p0.owner)
        .unwrap();
    let node_a = c.node(a).unwrap();
    let mut conn = tokio::net::TcpStream::connect(node_a.resp_addr())
        .await
        .unwrap();
    assert_eq!(
        raw_command(&mut conn, &["SET", key, "only-on-a"]).await,
        Frame::ok()
    );
    let f = NodeInfo {
        id: NodeId(9_997),
        resp_addr: primary_addr.into(),
        admin_addr: primary_addr.into(),
        state: NodeState::Up,
        weight: keyway_map::DEFAULT_NODE_WEIGHT,
        draining: false,
        zone: None,
        replica_addr: None,
    };
    let row = commit(
        &c,
        a,
        &p0,
        PartitionRecord {
            owner: f.id,
            replicas: vec![node_a.id()],
            in_sync: vec![node_a.id()],
            epoch: Epoch(p0.epoch.0 + 1),
            ..p0.clone()
        },
        vec![MapChange::UpsertNode(f)],
    )
    .await;
    assert!(
        node_a
            .shared()
            .routing
            .map()
            .owned_by(node_a.id())
            .next()
            .is_some(),
        "A is still the primary of other partitions"
    );
    node_a.shared().routing.grant_replica_read(
        row.id,
        row.epoch,
        Instant::now() + Duration::from_secs(60),
    );
    (dir, c, a)
}

/// Runs a client script (`read_key.*`: one line per read) against node `at`.
async fn read_key(
    program: &str,
    script: &str,
    c: &LocalCluster,
    at: usize,
    key: &str,
) -> Vec<String> {
    let port = c
        .node(at)
        .unwrap()
        .resp_addr()
        .rsplit_once(':')
        .unwrap()
        .1
        .to_string();
    let out = tokio::process::Command::new(program)
        .args([script, &port, key, "4"])
        .output()
        .await
        .unwrap_or_else(|e| panic!("run {program} {script}: {e}"));
    assert!(
        out.status.success(),
        "{program} {script} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

const IOREDIS_READ: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/js/read_key.js");
const REDIS_PY_READ: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/read_key.py");

/// ioredis with `scaleReads: 'slave'` keeps a connection to a node that is
/// a primary of any range as a master connection, which never sends
/// `READONLY`; A is a primary too (of other ranges). With the replica role
/// at its own address (the replica endpoint, listed as the range's replica
/// in `CLUSTER SLOTS`) ioredis takes it for a replica and reads from it
/// unmodified (without it: `-MOVED` to the primary, retried on the same
/// connection until "Too many Cluster redirections").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ioredis_scale_reads_slave_reads_from_a_replica_that_is_also_a_primary() {
    let key = "ioredis-replica-key";
    let (_dir, c, a) = replica_of_absent_primary(key, "127.0.0.1:1").await;
    let reads = read_key("node", IOREDIS_READ, &c, a, key).await;
    assert_eq!(reads, vec!["GOT only-on-a"; 4]);
    assert_eq!(
        c.node(a)
            .unwrap()
            .shared()
            .metrics
            .replica_reads_count(true),
        4
    );
    c.shutdown().await;
}

/// A stand-in primary on 127.0.0.1: answers every `GET` with
/// `from-primary` and anything else (`READONLY`, `CLIENT SETINFO`) `+OK`.
async fn stand_in_primary() -> (String, tokio::task::JoinHandle<()>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let task = tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut parser = keyway_resp::RequestParser::new(keyway_resp::Limits::default());
                let mut buf = bytes::BytesMut::new();
                while conn.read_buf(&mut buf).await.is_ok_and(|n| n > 0) {
                    while let Ok(Some(args)) = parser.parse(&mut buf) {
                        let reply: &[u8] = if args[0].eq_ignore_ascii_case(b"GET") {
                            b"$12\r\nfrom-primary\r\n"
                        } else {
                            b"+OK\r\n"
                        };
                        if conn.write_all(reply).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    (addr, task)
}

/// redis-py with `read_from_replicas=True` sends `READONLY` on every
/// connection and spreads reads over the slot's primary and the replicas
/// `CLUSTER SLOTS` lists, round robin: the replica serves its share. The
/// primary is a stand-in that answers `from-primary`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_py_read_from_replicas_reads_from_the_replica() {
    let key = "redis-py-replica-key";
    let (primary, stand_in) = stand_in_primary().await;
    let (_dir, c, a) = replica_of_absent_primary(key, &primary).await;
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let reads = read_key(&python, REDIS_PY_READ, &c, a, key).await;
    assert_eq!(
        reads,
        ["GOT from-primary", "GOT only-on-a"].repeat(2),
        "round robin over the primary and its replica"
    );
    assert_eq!(
        c.node(a)
            .unwrap()
            .shared()
            .metrics
            .replica_reads_count(true),
        2
    );
    stand_in.abort();
    c.shutdown().await;
}

/// Two nodes; A wrote one key in each of two partitions it owned, then
/// (metadata only) the lower one moved to absent primary F1 and the higher
/// one to absent primary F2, with A as their in-sync replica holding read
/// leases. A's replica role now copies ranges of two primaries, and its
/// `CLUSTER NODES` line can name one: F1, the owner of its first range.
/// Returns the cluster, A's index and the two keys (F1's, F2's).
async fn replica_of_two_absent_primaries(
    primaries: [&str; 2],
) -> (tempfile::TempDir, LocalCluster, usize, [String; 2]) {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = ClusterSpec::ephemeral(2, dir.path().to_path_buf());
    spec.node.lease_ttl_ms = 60_000;
    spec.manager = None;
    let c = LocalCluster::start(spec).await.expect("cluster starts");
    let map = c.map().await.unwrap();
    let a = 0;
    let node_a = c.node(a).unwrap();
    // Two keys in two partitions A owns, the lower partition first.
    assert!(
        map.owned_by(node_a.id()).count() >= 3,
        "A owns enough partitions"
    );
    let mut picked: Vec<(PartitionRecord, String)> = Vec::new();
    for i in 0..100_000 {
        let key = format!("two-primaries-{i}");
        let p = map
            .locate_slot(DEFAULT_KEYSPACE, key_hash_slot(key.as_bytes()))
            .unwrap();
        // Not slot 0's: redis-py sends its start-up `COMMAND` to the
        // primary of the first range, which must be a real node.
        let first = p.slot_span().0 == 0;
        if p.owner == node_a.id() && !first && !picked.iter().any(|(q, _)| q.id == p.id) {
            picked.push((p.clone(), key));
            if picked.len() == 2 {
                break;
            }
        }
    }
    picked.sort_by_key(|(p, _)| p.slot_span().0);
    assert_eq!(picked.len(), 2, "A owns two partitions");
    let mut conn = tokio::net::TcpStream::connect(node_a.resp_addr())
        .await
        .unwrap();
    for (_, key) in &picked {
        assert_eq!(
            raw_command(&mut conn, &["SET", key, "only-on-a"]).await,
            Frame::ok()
        );
    }
    for (i, (p0, _)) in picked.iter().enumerate() {
        let f = NodeInfo {
            id: NodeId(9_990 + i as u64),
            resp_addr: primaries[i].into(),
            admin_addr: primaries[i].into(),
            state: NodeState::Up,
            weight: keyway_map::DEFAULT_NODE_WEIGHT,
            draining: false,
            zone: None,
            replica_addr: None,
        };
        let row = commit(
            &c,
            a,
            p0,
            PartitionRecord {
                owner: f.id,
                replicas: vec![node_a.id()],
                in_sync: vec![node_a.id()],
                epoch: Epoch(p0.epoch.0 + 1),
                ..p0.clone()
            },
            vec![MapChange::UpsertNode(f)],
        )
        .await;
        node_a.shared().routing.grant_replica_read(
            row.id,
            row.epoch,
            Instant::now() + Duration::from_secs(60),
        );
    }
    let keys = [picked[0].1.clone(), picked[1].1.clone()];
    (dir, c, a, keys)
}

/// A replica role that copies ranges of two primaries names only the first
/// as its master in `CLUSTER NODES`; the clients route by `CLUSTER SLOTS`,
/// which lists it under both ranges, so they read the second primary's key
/// from it too: ioredis (`scaleReads: 'slave'`, reads only from replicas)
/// and redis-py (`read_from_replicas`, round robin with the primary, here
/// a stand-in answering `from-primary`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_read_a_replica_of_two_primaries_whatever_its_nodes_line_names() {
    let (_dir, c, a, keys) = replica_of_two_absent_primaries(["127.0.0.1:1", "127.0.0.1:2"]).await;
    let node_a = c.node(a).unwrap();
    let mut main = tokio::net::TcpStream::connect(node_a.resp_addr())
        .await
        .unwrap();
    let Frame::Bulk(nodes) = raw_command(&mut main, &["CLUSTER", "NODES"]).await else {
        panic!("CLUSTER NODES is a bulk string")
    };
    let nodes = String::from_utf8_lossy(&nodes).into_owned();
    let line = nodes
        .lines()
        .find(|l| l.starts_with(&node_a.id().replica_role_id()))
        .unwrap_or_else(|| panic!("no replica line for A: {nodes}"));
    assert!(
        line.contains(&format!(" slave {} ", NodeId(9_990))),
        "A's replica role names F1, the owner of its first range: {line}"
    );
    let reads = read_key("node", IOREDIS_READ, &c, a, &keys[1]).await;
    assert_eq!(reads, vec!["GOT only-on-a"; 4], "F2's key, from A");
    assert_eq!(node_a.shared().metrics.replica_reads_count(true), 4);
    c.shutdown().await;

    let (p1, stand_in_1) = stand_in_primary().await;
    let (p2, stand_in_2) = stand_in_primary().await;
    let (_dir, c, a, keys) = replica_of_two_absent_primaries([&p1, &p2]).await;
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let reads = read_key(&python, REDIS_PY_READ, &c, a, &keys[1]).await;
    assert_eq!(
        reads,
        ["GOT from-primary", "GOT only-on-a"].repeat(2),
        "F2's key: round robin over F2 and A"
    );
    stand_in_1.abort();
    stand_in_2.abort();
    c.shutdown().await;
}
