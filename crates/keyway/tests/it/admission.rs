//! One admission path for every command family: `SCAN`, `DBSIZE`, `INFO`'s
//! key count, `CLUSTER COUNTKEYSINSLOT`/`GETKEYSINSLOT` and `KW.SCAN`'s
//! local steps are checked like data commands (lease, fence, ownership,
//! under the routing read guard), run in pipeline order, and answer after
//! group commit.

use crate::common;

use bytes::{Bytes, BytesMut};
use common::key_in_slot;
use keyway_cluster::{ClusterSpec, LocalCluster};
use keyway_map::{DEFAULT_KEYSPACE, PartitionId, Routing};
use keyway_node::server::Shared;
use keyway_resp::{Frame, Limits, Protocol, ResponseParser, encode};
use keyway_testkit::eventually;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const LAPSED: &str = "CLUSTERDOWN The cluster is down (node lease lapsed)";

/// One node owning every partition.
async fn one_node(dir: &std::path::Path) -> LocalCluster {
    let mut spec = ClusterSpec::ephemeral(1, dir.to_path_buf());
    spec.node.lease_ttl_ms = 60_000;
    spec.manager = None;
    LocalCluster::start(spec).await.expect("cluster starts")
}

struct Conn {
    stream: TcpStream,
    parser: ResponseParser,
    buf: BytesMut,
}

impl Conn {
    async fn connect(addr: &str) -> Conn {
        Conn {
            stream: TcpStream::connect(addr).await.unwrap(),
            parser: ResponseParser::new(Limits::default()),
            buf: BytesMut::new(),
        }
    }

    /// Writes every request in one write (a pipeline).
    async fn send(&mut self, requests: &[&[&str]]) {
        let mut out = BytesMut::new();
        for args in requests {
            let frame = Frame::Array(
                args.iter()
                    .map(|a| Frame::Bulk(Bytes::copy_from_slice(a.as_bytes())))
                    .collect(),
            );
            encode(&frame, Protocol::Resp2, &mut out);
        }
        self.stream.write_all(&out).await.unwrap();
    }

    async fn read(&mut self) -> Frame {
        loop {
            if let Some(f) = self.parser.parse(&mut self.buf).unwrap() {
                return f;
            }
            assert!(
                self.stream.read_buf(&mut self.buf).await.unwrap() > 0,
                "connection closed"
            );
        }
    }

    async fn cmd(&mut self, args: &[&str]) -> Frame {
        self.send(&[args]).await;
        self.read().await
    }
}

fn error(text: &str) -> Frame {
    Frame::Error(text.into())
}

fn partition_of(shared: &Shared, slot: u16) -> PartitionId {
    shared
        .routing
        .map()
        .locate_slot(DEFAULT_KEYSPACE, slot)
        .unwrap()
        .id
}

/// Waits until `n` more requests than `before` are parked on the node.
async fn parked(shared: &Arc<Shared>, before: u64, n: u64) {
    eventually(
        "requests parked behind the fence",
        Duration::from_secs(10),
        || {
            let held = shared.metrics.held.get();
            async move { (held >= before + n).then_some(()) }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_a_lapsed_lease_refuses_every_read() {
    let dir = tempfile::tempdir().unwrap();
    let c = one_node(dir.path()).await;
    let node = c.node(0).unwrap();
    let shared = node.shared().clone();
    let ks = keyway_manager::create_keyspace(&**c.meta(), "events", Routing::Range, None)
        .await
        .unwrap();
    let mut conn = Conn::connect(node.resp_addr()).await;
    eventually(
        "the node serves the range keyspace",
        Duration::from_secs(10),
        || {
            let has = shared.routing.map().keyspaces.contains_key(&ks.id);
            async move { has.then_some(()) }
        },
    )
    .await;
    let key = key_in_slot(42, "a");
    assert_eq!(conn.cmd(&["SET", &key, "v"]).await, Frame::ok());
    assert_eq!(
        conn.cmd(&["KW.SET", "events", "e1", "v"]).await,
        Frame::ok()
    );
    assert_eq!(conn.cmd(&["DBSIZE"]).await, Frame::Integer(1));

    shared.routing.revoke_lease();
    assert_eq!(conn.cmd(&["SCAN", "0"]).await, error(LAPSED));
    assert_eq!(conn.cmd(&["DBSIZE"]).await, error(LAPSED));
    assert_eq!(
        conn.cmd(&["CLUSTER", "COUNTKEYSINSLOT", "42"]).await,
        error(LAPSED)
    );
    assert_eq!(
        conn.cmd(&["CLUSTER", "GETKEYSINSLOT", "42", "10"]).await,
        error(LAPSED)
    );
    assert_eq!(
        conn.cmd(&["KW.SCAN", "events", "", ""]).await,
        error(LAPSED)
    );
    let text = match conn.cmd(&["INFO"]).await {
        Frame::Bulk(text) | Frame::Verbatim { text, .. } => text,
        other => panic!("INFO is answered, got {other:?}"),
    };
    let text = String::from_utf8_lossy(&text);
    assert!(!text.contains("db0:keys="), "{text}");
    assert!(
        text.contains(&format!("keyway_keys_unavailable:{LAPSED}")),
        "{text}"
    );
    c.shutdown().await;
}

/// A read of a fenced partition's keys parks like a data command and
/// answers once the fence lifts (it never reads around the fence).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_of_a_fenced_partition_wait_for_the_fence() {
    let dir = tempfile::tempdir().unwrap();
    let c = one_node(dir.path()).await;
    let node = c.node(0).unwrap();
    let shared = node.shared().clone();
    let slot = 7;
    let key = key_in_slot(slot, "a");
    let mut conn = Conn::connect(node.resp_addr()).await;
    assert_eq!(conn.cmd(&["SET", &key, "v"]).await, Frame::ok());
    let pid = partition_of(&shared, slot);
    let reads: [&[&str]; 4] = [
        &["SCAN", "0", "COUNT", "1000"],
        &["DBSIZE"],
        &["CLUSTER", "COUNTKEYSINSLOT", "7"],
        &["CLUSTER", "GETKEYSINSLOT", "7", "10"],
    ];
    let want = [
        Frame::Array(vec![
            Frame::bulk("0"),
            Frame::Array(vec![Frame::Bulk(key.clone().into())]),
        ]),
        Frame::Integer(1),
        Frame::Integer(1),
        Frame::Array(vec![Frame::Bulk(key.clone().into())]),
    ];
    for (read, want) in reads.iter().zip(want) {
        shared.routing.set_fenced(pid, true);
        let before = shared.metrics.held.get();
        let mut reader = Conn::connect(node.resp_addr()).await;
        reader.send(&[read]).await;
        parked(&shared, before, 1).await;
        shared.routing.set_fenced(pid, false);
        assert_eq!(reader.read().await, want, "{read:?}");
    }
    c.shutdown().await;
}

/// `SET k v; DBSIZE` and `SET {t}a v; CLUSTER COUNTKEYSINSLOT slot` in one
/// pipeline: the read sees the write, even when the write was parked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipelined_read_sees_the_write_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let c = one_node(dir.path()).await;
    let node = c.node(0).unwrap();
    let shared = node.shared().clone();
    let slot = 99;
    let pid = partition_of(&shared, slot);
    let slot_text = slot.to_string();
    let cases: [(&str, &[&str], Frame); 3] = [
        ("a", &["DBSIZE"], Frame::Integer(1)),
        (
            "b",
            &["CLUSTER", "COUNTKEYSINSLOT", &slot_text],
            Frame::Integer(2),
        ),
        ("c", &["SCAN", "0", "COUNT", "1000"], Frame::Null),
    ];
    for (suffix, read, want) in cases {
        let key = key_in_slot(slot, suffix);
        // The write parks behind a fence, so a read that does not wait for
        // it would answer first.
        shared.routing.set_fenced(pid, true);
        let before = shared.metrics.held.get();
        let mut conn = Conn::connect(node.resp_addr()).await;
        conn.send(&[&["SET", &key, "v"], read]).await;
        parked(&shared, before, 1).await;
        shared.routing.set_fenced(pid, false);
        assert_eq!(conn.read().await, Frame::ok());
        let got = conn.read().await;
        match want {
            Frame::Null => {
                let Frame::Array(parts) = &got else {
                    panic!("SCAN reply {got:?}")
                };
                assert!(
                    matches!(&parts[1], Frame::Array(keys) if keys.contains(&Frame::Bulk(key.clone().into()))),
                    "SCAN after SET {key} missed it: {got:?}"
                );
            }
            want => assert_eq!(got, want, "{read:?} after SET {key}"),
        }
    }
    c.shutdown().await;
}

/// Across storage threads: a pipeline of writes to many slots, then
/// `DBSIZE`, then `SCAN`: both see every write before them (the connection
/// queues a node-wide read only once every earlier reply was released).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_wide_read_waits_for_the_pipeline_before_it_on_every_thread() {
    const ROUNDS: usize = 20;
    const WRITES: usize = 200;
    let dir = tempfile::tempdir().unwrap();
    let mut spec = ClusterSpec::ephemeral(1, dir.path().to_path_buf());
    spec.node.lease_ttl_ms = 60_000;
    spec.node.executor_threads = 4;
    spec.manager = None;
    let c = LocalCluster::start(spec).await.expect("cluster starts");
    let node = c.node(0).unwrap();
    let mut conn = Conn::connect(node.resp_addr()).await;
    for round in 0..ROUNDS {
        let keys: Vec<String> = (0..WRITES).map(|i| format!("r{round}:{i}")).collect();
        let mut requests: Vec<Vec<&str>> = keys.iter().map(|k| vec!["SET", k, "v"]).collect();
        requests.push(vec!["DBSIZE"]);
        requests.push(vec!["SCAN", "0", "COUNT", "100000"]);
        let requests: Vec<&[&str]> = requests.iter().map(|r| r.as_slice()).collect();
        conn.send(&requests).await;
        for _ in 0..WRITES {
            assert_eq!(conn.read().await, Frame::ok());
        }
        let total = ((round + 1) * WRITES) as i64;
        assert_eq!(
            conn.read().await,
            Frame::Integer(total),
            "DBSIZE, round {round}"
        );
        let Frame::Array(parts) = conn.read().await else {
            panic!("SCAN reply")
        };
        let Frame::Array(found) = &parts[1] else {
            panic!("SCAN keys")
        };
        assert_eq!(found.len() as i64, total, "SCAN, round {round}");
    }
    c.shutdown().await;
}
