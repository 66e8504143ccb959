//! Lease fencing (invariant 4) with real processes: a node paused with
//! SIGSTOP for longer than its lease answers nothing from its stale view
//! when it wakes, and the cluster rides out a metadata-store outage.

use crate::common;

use common::{Proc, Resp, free_port_block, redis_cli, spawn_servers};
use keyway_manager::{FencingGate, Verdict};
use keyway_map::{
    DEFAULT_KEYSPACE, Epoch, MapChange, NodeId, OwnershipCondition, PartitionRecord, key_hash_slot,
};
use keyway_meta::{MapTxn, MetaStore};
use keyway_resp::Frame;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

const LEASE_TTL_MS: u64 = 2000;
const LEASE_MARGIN_MS: u64 = 500;

struct Cluster {
    meta: Option<Proc>,
    servers: Vec<Proc>,
    meta_addr: String,
    meta_url: String,
    ports: Vec<u16>,
    base: u16,
}

fn meta_args(addr: &str, dir: &Path) -> Vec<String> {
    [
        "meta",
        "--listen",
        addr,
        "--data",
        &dir.join("meta").display().to_string(),
        "--bootstrap-nodes",
        "2",
        "--partitions-per-node",
        "2",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Two `keyway server`s on `etcd_url`, or on a `keyway meta` process when None.
fn start(dir: &Path, etcd_url: Option<String>) -> Cluster {
    let base = free_port_block(5);
    let meta_addr = format!("127.0.0.1:{base}");
    let (meta, meta_url, bootstrap) = match etcd_url {
        Some(url) => (
            None,
            url,
            vec![
                "--bootstrap-nodes".to_string(),
                "2".into(),
                "--partitions-per-node".into(),
                "2".into(),
            ],
        ),
        None => {
            let meta = Proc::spawn(&meta_args(&meta_addr, dir), "keyway meta listening");
            (Some(meta), format!("keyway://{meta_addr}"), vec![])
        }
    };
    let mut extra = vec![
        "--lease-ttl-ms".to_string(),
        LEASE_TTL_MS.to_string(),
        "--lease-margin-ms".into(),
        LEASE_MARGIN_MS.to_string(),
    ];
    extra.extend(bootstrap);
    let (ports, servers) = spawn_servers(&meta_url, 2, base + 1, dir, &extra);
    let cluster = Cluster {
        meta,
        servers,
        meta_addr,
        meta_url,
        ports,
        base,
    };
    wait_until("cluster ok", Duration::from_secs(30), || {
        cluster
            .ports
            .iter()
            .all(|p| redis_cli(*p, &["cluster", "info"]).contains("cluster_state:ok"))
    });
    cluster
}

fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn node_id_of(port: u16) -> NodeId {
    NodeId::parse(&redis_cli(port, &["cluster", "myid"])).unwrap()
}

/// A key whose partition `owner` holds.
fn key_owned_by(map: &keyway_map::PartitionMap, owner: NodeId) -> String {
    (0..100_000)
        .map(|i| format!("fence{i}"))
        .find(|k| {
            map.locate_slot(DEFAULT_KEYSPACE, key_hash_slot(k.as_bytes()))
                .unwrap()
                .owner
                == owner
        })
        .unwrap()
}

#[test]
fn a_paused_node_serves_nothing_from_its_stale_view_after_waking() {
    paused_node_scenario(None);
}

#[test]
fn a_paused_node_serves_nothing_from_its_stale_view_after_waking_on_etcd() {
    let etcd = keyway_testkit::EtcdCluster::start(1)
        .expect("etcd starts (run scripts/setup.sh to install it)");
    paused_node_scenario(Some(etcd.url("/keyway/fencing")));
}

fn paused_node_scenario(etcd_url: Option<String>) {
    let dir = tempfile::tempdir().unwrap();
    let cluster = start(dir.path(), etcd_url);
    let rt = runtime();
    let meta: Arc<dyn MetaStore> = rt
        .block_on(keyway_meta::connect(&cluster.meta_url))
        .unwrap();
    let (a_port, b_port) = (cluster.ports[0], cluster.ports[1]);
    let (a, b) = (node_id_of(a_port), node_id_of(b_port));
    let map = rt.block_on(meta.get_map()).unwrap();
    let key = key_owned_by(&map, a);
    assert_eq!(redis_cli(a_port, &["set", &key, "v1"]), "OK");

    // A connection opened before the pause; its requests will wait in the socket.
    let mut stale_conn = Resp::connect(a_port);
    assert_eq!(stale_conn.cmd(&["GET", &key]), Frame::Bulk("v1".into()));
    cluster.servers[0].pause();

    // The manager-side rule: reassign only after the lease expired in the store, plus the margin.
    let mut gate = FencingGate::new(Duration::from_millis(LEASE_MARGIN_MS));
    wait_until("A to be fenced", Duration::from_secs(20), || {
        rt.block_on(gate.check_store(&*meta, a)).unwrap() == Verdict::Fenced
    });
    let p: PartitionRecord = map
        .locate_slot(DEFAULT_KEYSPACE, key_hash_slot(key.as_bytes()))
        .unwrap()
        .clone();
    let moved = PartitionRecord {
        owner: b,
        epoch: Epoch(p.epoch.0 + 1),
        ..p.clone()
    };
    rt.block_on(meta.commit(MapTxn {
        conditions: vec![OwnershipCondition {
            partition: p.id,
            expected: Some((a, p.epoch)),
        }],
        changes: vec![MapChange::UpsertPartition(moved)],
    }))
    .unwrap();
    wait_until("B to serve the partition", Duration::from_secs(10), || {
        redis_cli(b_port, &["set", &key, "v2"]) == "OK"
    });

    // Queue reads and a write at the frozen node, then wake it: every reply must be a rejection.
    let mut pipeline = Vec::new();
    for _ in 0..50 {
        pipeline.extend_from_slice(
            format!("*2\r\n$3\r\nGET\r\n${}\r\n{key}\r\n", key.len()).as_bytes(),
        );
    }
    pipeline.extend_from_slice(
        format!(
            "*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n$5\r\nstale\r\n",
            key.len()
        )
        .as_bytes(),
    );
    stale_conn.send_raw(&pipeline).unwrap();
    cluster.servers[0].resume();
    for i in 0..51 {
        match stale_conn.read_reply().unwrap() {
            Frame::Error(e) if e.starts_with("CLUSTERDOWN") || e.starts_with("MOVED") => {}
            other => panic!("request {i} served from the stale view: {other:?}"),
        }
    }
    // Once it has renewed and re-read the map, A redirects to B; B has v2.
    let b_addr = format!("MOVED {} 127.0.0.1:{b_port}", key_hash_slot(key.as_bytes()));
    wait_until("A to redirect to B", Duration::from_secs(20), || {
        redis_cli(a_port, &["get", &key]) == b_addr
    });
    assert_eq!(redis_cli(b_port, &["get", &key]), "v2");
}

#[test]
fn nodes_ride_out_a_metadata_store_outage_and_resume_without_help() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = start(dir.path(), None);
    let port = cluster.ports[0];
    let mut c = Resp::connect(port);
    let mut acked = Vec::new();
    let write = |c: &mut Resp, acked: &mut Vec<String>, i: usize| {
        let key = format!("{{outage}}{i}");
        if c.cmd(&["SET", &key, "v"]) == Frame::Simple("OK".into()) {
            acked.push(key);
        }
    };
    // The node owning {outage} is wherever it is; follow one MOVED if needed.
    let owner_port = match c.cmd(&["SET", "{outage}probe", "v"]) {
        Frame::Error(e) if e.starts_with("MOVED") => {
            e.rsplit(':').next().unwrap().parse::<u16>().unwrap()
        }
        _ => port,
    };
    let mut c = Resp::connect(owner_port);
    for i in 0..100 {
        write(&mut c, &mut acked, i);
    }
    assert_eq!(acked.len(), 100);

    cluster.meta.take().unwrap().kill9();
    let killed_at = Instant::now();
    // While the lease lasts, the node keeps serving from its cached map.
    write(&mut c, &mut acked, 100);
    assert_eq!(
        acked.len(),
        101,
        "node stopped serving while its lease was still valid"
    );
    // Then it stops, within TTL + margin (+ scheduling slack).
    wait_until(
        "the node to stop serving",
        Duration::from_millis(LEASE_TTL_MS + LEASE_MARGIN_MS + 2000),
        || matches!(c.cmd(&["GET", "{outage}0"]), Frame::Error(e) if e.starts_with("CLUSTERDOWN")),
    );
    assert!(killed_at.elapsed() <= Duration::from_millis(LEASE_TTL_MS + 2000));

    // The store comes back on the same address and data: service resumes with no operator action.
    cluster.meta = Some(Proc::spawn(
        &meta_args(&cluster.meta_addr, dir.path()),
        "keyway meta listening",
    ));
    wait_until("service to resume", Duration::from_secs(30), || {
        c.cmd(&["GET", "{outage}0"]) == Frame::Bulk("v".into())
    });
    for key in &acked {
        assert_eq!(
            c.cmd(&["GET", key]),
            Frame::Bulk("v".into()),
            "acknowledged {key} lost"
        );
    }
    let _ = cluster.base;
}
