//! Reads switched ahead of writes (DESIGN13 interface 1), on a real
//! in-process 2-node cluster whose partitions each have the other node as
//! an in-sync replica: with `reads_from` = the replica in a partition's
//! record (committed directly, as the leading manager would), the smart
//! client's reads of that partition are served by the replica (its
//! `served_reads_from` count grows, the owner runs none of them) while
//! writes still run at the owner; a stale client learns it from the
//! owner's `-KWREADS`; after `reads_from` is cleared, reads go back. The
//! same through `keyway proxy` for a plain Redis connection.

use crate::common;
use common::replica::{cas, replicate_everything};
use keyway_client::{Client, ClientConfig, Strategy};
use keyway_cluster::{ClusterSpec, LocalCluster};
use keyway_map::{NodeId, key_hash_slot};
use keyway_testkit::eventually;
use std::time::Duration;

async fn cluster(dir: &std::path::Path) -> LocalCluster {
    let mut spec = ClusterSpec::ephemeral(2, dir.to_path_buf());
    spec.partitions_per_node = 2;
    spec.manager = None;
    spec.node.lease_ttl_ms = 30_000;
    spec.node.replica_lag_timeout_ms = 1_000;
    spec.node.replica_read_lease_ms = 400;
    spec.node.replica_heartbeat_ms = 100;
    LocalCluster::start(spec).await.expect("cluster starts")
}

async fn client_with(c: &LocalCluster, strategy: Strategy) -> Client {
    let seeds: Vec<String> = c.resp_addrs().into_iter().flatten().collect();
    let seeds: Vec<&str> = seeds.iter().map(|s| s.as_str()).collect();
    let config = ClientConfig {
        strategy,
        ..ClientConfig::default()
    };
    Client::connect(&seeds, config).await.unwrap()
}

async fn client(c: &LocalCluster) -> Client {
    client_with(c, Strategy::Hybrid).await
}

/// (storage commands run, reads served because of reads_from) per node.
fn counts(c: &LocalCluster, id: NodeId) -> (u64, u64) {
    let i = c.node_ids().iter().position(|n| *n == Some(id)).unwrap();
    let m = &c.node(i).unwrap().shared().metrics;
    (m.commands.get(), m.reads_from_served_count())
}

/// Reads every key once and returns what ran where: (owner's storage
/// commands, target's storage commands, target's reads_from reads).
async fn read_round(
    c: &LocalCluster,
    cl: &Client,
    keys: &[String],
    owner: NodeId,
    target: NodeId,
    want: &[u8],
) -> (u64, u64, u64) {
    let (o0, _) = counts(c, owner);
    let (t0, s0) = counts(c, target);
    for k in keys {
        assert_eq!(
            cl.get(k.as_bytes()).await.unwrap().as_deref(),
            Some(want),
            "{k}"
        );
    }
    let (o1, _) = counts(c, owner);
    let (t1, s1) = counts(c, target);
    (o1 - o0, t1 - t0, s1 - s0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_go_to_reads_from_while_writes_stay_at_the_owner_and_come_back_when_cleared() {
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(dir.path()).await;
    let map = replicate_everything(&c).await;
    let p = map.partitions.values().next().unwrap().clone();
    let (owner, target) = (p.owner, p.replicas[0]);
    let keys: Vec<String> = (0..5_000)
        .map(|i| format!("k{i}"))
        .filter(|k| p.contains(&key_hash_slot(k.as_bytes()).to_be_bytes()))
        .take(50)
        .collect();
    let n = keys.len() as u64;
    let stale = client(&c).await;
    // A redirect client only patches what rejections carry: it learns
    // reads_from from the owner's -KWREADS alone.
    let redirect = client_with(&c, Strategy::Redirect).await;
    for k in &keys {
        stale.set(k.as_bytes(), b"v1").await.unwrap();
    }
    // Before: every read runs at the owner.
    assert_eq!(
        read_round(&c, &stale, &keys, owner, target, b"v1").await,
        (n, 0, 0)
    );

    let p = c.map().await.unwrap().partitions[&p.id].clone();
    cas(&c, &p, |r| r.reads_from = Some(target)).await;
    // A client started after the change learns it with its first map
    // (once the node it asks has installed the new epoch: the commit
    // reaches each node through its watch).
    let fresh = eventually("a fresh client's map", Duration::from_secs(10), || async {
        let fresh = client(&c).await;
        (fresh.map().partitions[&p.id].reads_from == Some(target)).then_some(fresh)
    })
    .await;
    // Reads land at the target once it holds a read lease at the new epoch
    // (until then it refuses and the client falls back to the owner).
    eventually(
        "reads served by the target",
        Duration::from_secs(10),
        || async {
            let ran = read_round(&c, &fresh, &keys, owner, target, b"v1").await;
            (ran == (0, n, n)).then_some(())
        },
    )
    .await;
    let stats = fresh.stats();
    assert!(stats.reads_from_sends >= n, "{stats:?}");
    // The stale client learns it from the owner's KWREADS (or a refresh).
    eventually(
        "the stale client reads from the target",
        Duration::from_secs(10),
        || async {
            let ran = read_round(&c, &stale, &keys, owner, target, b"v1").await;
            (ran == (0, n, n)).then_some(())
        },
    )
    .await;
    let stats = stale.stats();
    assert!(
        stats.rejections_kwreads + stats.rejections_kwmoved >= 1,
        "{stats:?}"
    );
    eventually(
        "the redirect client reads from the target",
        Duration::from_secs(10),
        || async {
            let ran = read_round(&c, &redirect, &keys, owner, target, b"v1").await;
            (ran == (0, n, n)).then_some(())
        },
    )
    .await;
    let stats = redirect.stats();
    assert!(stats.rejections_kwreads >= 1, "{stats:?}");
    // Writes still run at the owner, and the target serves them after.
    let (o0, _) = counts(&c, owner);
    let (t0, _) = counts(&c, target);
    for k in &keys {
        fresh.set(k.as_bytes(), b"v2").await.unwrap();
    }
    assert_eq!(counts(&c, owner).0 - o0, n, "writes at the owner");
    assert_eq!(counts(&c, target).0 - t0, 0, "no write at the target");
    assert_eq!(
        read_round(&c, &fresh, &keys, owner, target, b"v2").await,
        (0, n, n)
    );

    // Cleared: reads go back to the owner.
    let p = c.map().await.unwrap().partitions[&p.id].clone();
    cas(&c, &p, |r| r.reads_from = None).await;
    eventually(
        "reads back at the owner",
        Duration::from_secs(10),
        || async {
            let ran = read_round(&c, &fresh, &keys, owner, target, b"v2").await;
            (ran == (n, 0, 0)).then_some(())
        },
    )
    .await;
    c.shutdown().await;
}

/// A plain RESP connection (what a Redis client without cluster support
/// sends to `keyway proxy`).
struct Plain {
    stream: tokio::net::TcpStream,
    buf: bytes::BytesMut,
    parser: keyway_resp::ResponseParser,
}

impl Plain {
    async fn connect(addr: &str) -> Plain {
        Plain {
            stream: tokio::net::TcpStream::connect(addr).await.unwrap(),
            buf: bytes::BytesMut::new(),
            parser: keyway_resp::ResponseParser::new(keyway_resp::Limits::default()),
        }
    }

    async fn cmd(&mut self, args: &[&[u8]]) -> keyway_resp::Frame {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let frame = keyway_resp::Frame::Array(
            args.iter()
                .map(|a| keyway_resp::Frame::Bulk(bytes::Bytes::copy_from_slice(a)))
                .collect(),
        );
        let mut out = bytes::BytesMut::new();
        keyway_resp::encode(&frame, keyway_resp::Protocol::Resp2, &mut out);
        self.stream.write_all(&out).await.unwrap();
        loop {
            if let Some(reply) = self.parser.parse(&mut self.buf).unwrap() {
                return reply;
            }
            assert!(self.stream.read_buf(&mut self.buf).await.unwrap() > 0);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_sends_reads_to_reads_from_and_writes_to_the_owner() {
    use keyway_resp::Frame;
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(dir.path()).await;
    let map = replicate_everything(&c).await;
    let p = map.partitions.values().next().unwrap().clone();
    let (owner, target) = (p.owner, p.replicas[0]);
    let keys: Vec<String> = (0..5_000)
        .map(|i| format!("k{i}"))
        .filter(|k| p.contains(&key_hash_slot(k.as_bytes()).to_be_bytes()))
        .take(50)
        .collect();
    let n = keys.len() as u64;
    let config = keyway_proxy::ProxyConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        admin_listen: "127.0.0.1:0".parse().unwrap(),
        ..keyway_proxy::ProxyConfig::default()
    };
    let proxy = keyway_proxy::Proxy::start(config, c.meta().clone())
        .await
        .unwrap();
    let conn = tokio::sync::Mutex::new(Plain::connect(proxy.resp_addr()).await);
    let cmd = |args: Vec<Vec<u8>>| {
        let conn = &conn;
        async move {
            let args: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
            conn.lock().await.cmd(&args).await
        }
    };
    let round = |value: &'static [u8]| {
        let (keys, c, cmd) = (keys.clone(), &c, &cmd);
        async move {
            let (o0, _) = counts(c, owner);
            let (t0, s0) = counts(c, target);
            for k in &keys {
                let got = cmd(vec![b"GET".to_vec(), k.as_bytes().to_vec()]).await;
                assert_eq!(got, Frame::Bulk(bytes::Bytes::from_static(value)), "{k}");
            }
            let (o1, _) = counts(c, owner);
            let (t1, s1) = counts(c, target);
            (o1 - o0, t1 - t0, s1 - s0)
        }
    };
    let set = |value: &'static [u8]| {
        let (keys, cmd) = (keys.clone(), &cmd);
        async move {
            for k in &keys {
                let reply = cmd(vec![b"SET".to_vec(), k.as_bytes().to_vec(), value.to_vec()]).await;
                assert!(matches!(reply, Frame::Simple(_)), "{k}: {reply:?}");
            }
        }
    };
    set(b"v1").await;
    assert_eq!(round(b"v1").await, (n, 0, 0));

    let p = c.map().await.unwrap().partitions[&p.id].clone();
    cas(&c, &p, |r| r.reads_from = Some(target)).await;
    eventually(
        "proxied reads served by the target",
        Duration::from_secs(10),
        || async { (round(b"v1").await == (0, n, n)).then_some(()) },
    )
    .await;
    assert!(proxy.status().reads_from_sent >= n);
    let (o0, _) = counts(&c, owner);
    let (t0, _) = counts(&c, target);
    set(b"v2").await;
    assert_eq!(counts(&c, owner).0 - o0, n, "writes at the owner");
    assert_eq!(counts(&c, target).0 - t0, 0, "no write at the target");
    assert_eq!(round(b"v2").await, (0, n, n));

    let p = c.map().await.unwrap().partitions[&p.id].clone();
    cas(&c, &p, |r| r.reads_from = None).await;
    eventually(
        "proxied reads back at the owner",
        Duration::from_secs(10),
        || async { (round(b"v2").await == (n, 0, 0)).then_some(()) },
    )
    .await;
    proxy.shutdown().await;
    c.shutdown().await;
}
