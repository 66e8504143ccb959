//! Issue 5's last "Done when": an ordered `KW.SCAN` over a range keyspace
//! returns every key in order while partitions split and move under it.
//!
//! 3 nodes, one range keyspace of `KEYS` keys. A churn task splits a random
//! partition of the keyspace at a random key and moves a random partition to
//! another node, round after round, each move live (copy, catch-up, dual
//! writes, fence, flip). Meanwhile scanners page through the whole keyspace
//! with small LIMITs, each over a raw RESP connection to one fixed node (so
//! that node's walk crosses partitions and nodes by itself); every full scan
//! must return exactly the keys, each with its value, in strictly
//! increasing order.

use bytes::{Bytes, BytesMut};
use keyway_client::{Client, ClientConfig};
use keyway_cluster::{ClusterSpec, LocalCluster};
use keyway_manager::{SplitAt, create_keyspace, request_move, split_partition};
use keyway_map::{KeyspaceId, NodeId, PartitionRecord, Routing};
use keyway_resp::{Frame, Limits, Protocol, ResponseParser, encode};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const KEYS: usize = 3_000;
const ROUNDS: usize = 6;
const PAGE: usize = 61;
const WAIT: Duration = Duration::from_secs(60);

fn key(i: usize) -> String {
    format!("user:{i:05}")
}

fn value(i: usize) -> String {
    format!("v{i}")
}

/// A raw RESP connection to one node.
struct Conn {
    stream: TcpStream,
    buf: BytesMut,
    parser: ResponseParser,
}

impl Conn {
    async fn connect(addr: &str) -> Conn {
        Conn {
            stream: TcpStream::connect(addr).await.unwrap(),
            buf: BytesMut::new(),
            parser: ResponseParser::new(Limits::default()),
        }
    }

    async fn cmd(&mut self, args: &[&[u8]]) -> Frame {
        let frame = Frame::Array(
            args.iter()
                .map(|a| Frame::Bulk(Bytes::copy_from_slice(a)))
                .collect(),
        );
        let mut out = BytesMut::new();
        encode(&frame, Protocol::Resp2, &mut out);
        self.stream.write_all(&out).await.unwrap();
        loop {
            if let Some(f) = self.parser.parse(&mut self.buf).unwrap() {
                return f;
            }
            let n = self.stream.read_buf(&mut self.buf).await.unwrap();
            assert!(n > 0, "connection closed");
        }
    }
}

/// One full scan through `conn`, page by page; `Err` on an error reply.
async fn full_scan(conn: &mut Conn) -> Result<Vec<(Bytes, Bytes)>, String> {
    let mut out = Vec::new();
    let mut cursor = Bytes::new();
    let limit = PAGE.to_string();
    loop {
        let reply = conn
            .cmd(&[
                b"KW.SCAN",
                b"users",
                &cursor,
                b"",
                b"LIMIT",
                limit.as_bytes(),
            ])
            .await;
        let Frame::Array(parts) = reply else {
            return Err(format!("KW.SCAN answered {reply:?}"));
        };
        let [next, Frame::Array(flat)] = &parts[..] else {
            return Err(format!("bad KW.SCAN reply {parts:?}"));
        };
        for kv in flat.chunks(2) {
            let (Frame::Bulk(k), Frame::Bulk(v)) = (&kv[0], &kv[1]) else {
                return Err(format!("bad entry {kv:?}"));
            };
            out.push((k.clone(), v.clone()));
        }
        match next {
            Frame::Bulk(c) => cursor = c.clone(),
            Frame::Null => return Ok(out),
            other => return Err(format!("bad cursor {other:?}")),
        }
    }
}

fn check(scan: &[(Bytes, Bytes)]) -> Result<(), String> {
    if scan.len() != KEYS {
        return Err(format!("{} entries, expected {KEYS}", scan.len()));
    }
    for (i, (k, v)) in scan.iter().enumerate() {
        if k[..] != *key(i).as_bytes() || v[..] != *value(i).as_bytes() {
            return Err(format!(
                "entry {i} is {k:?}={v:?}, expected {}={}",
                key(i),
                value(i)
            ));
        }
    }
    Ok(())
}

fn partitions(map: &keyway_map::PartitionMap, ks: KeyspaceId) -> Vec<PartitionRecord> {
    map.keyspace_partitions(ks).cloned().collect()
}

/// Splits a random partition of `ks` at a random key inside it, then moves
/// a random partition of `ks` to another node and waits for the move to end.
async fn churn_round(c: &LocalCluster, ks: KeyspaceId, rng: &mut StdRng) -> String {
    let map = c.map().await.unwrap();
    let parts = partitions(&map, ks);
    let p = &parts[rng.random_range(0..parts.len())];
    let inside: Vec<usize> = (1..KEYS)
        .filter(|&i| p.contains(key(i).as_bytes()) && key(i).as_bytes() > &p.start[..])
        .collect();
    let mut log = String::new();
    if !inside.is_empty() {
        let at = key(inside[rng.random_range(0..inside.len())]);
        let (l, r) = split_partition(&**c.meta(), p.id, SplitAt::Key(Bytes::from(at.clone())))
            .await
            .unwrap_or_else(|e| panic!("split {} at {at}: {e}", p.id));
        log += &format!("split {} at {at} into {} and {}; ", p.id, l.id, r.id);
    }
    let map = c.map().await.unwrap();
    let parts = partitions(&map, ks);
    let p = parts[rng.random_range(0..parts.len())].clone();
    let others: Vec<NodeId> = map
        .nodes
        .keys()
        .copied()
        .filter(|n| *n != p.owner)
        .collect();
    let target = others[rng.random_range(0..others.len())];
    let rec = request_move(&**c.meta(), p.id, target)
        .await
        .unwrap_or_else(|e| panic!("move {} to {target}: {e}", p.id));
    let driver = c.manager().expect("a manager").driver();
    let deadline = Instant::now() + WAIT;
    loop {
        let list = driver.migrations().await.unwrap();
        let state = list
            .iter()
            .find(|m| m.id == rec.id)
            .map(|m| m.state.clone());
        match state.as_deref() {
            Some("DONE") => break,
            Some("ABORTED") => panic!("move of {} to {target} aborted: {list:?}", p.id),
            _ => {}
        }
        assert!(
            Instant::now() < deadline,
            "move of {} to {target} did not finish",
            p.id
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let now = c.map().await.unwrap();
    assert_eq!(now.partitions[&p.id].owner, target, "DONE but not moved");
    log + &format!("moved {} to {target}", p.id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kw_scan_returns_every_key_in_order_while_partitions_split_and_move() {
    let seed: u64 = match std::env::var("KEYWAY_TEST_SEED") {
        Ok(s) => s.parse().expect("KEYWAY_TEST_SEED must be a number"),
        Err(_) => rand::random(),
    };
    println!("seed {seed} (KEYWAY_TEST_SEED={seed} replays the same churn)");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let mut spec = ClusterSpec::ephemeral(3, dir.path().to_path_buf());
    spec.node.lease_ttl_ms = 60_000;
    spec.manager = Some(crate::common::manager_without_policies(false));
    let c = LocalCluster::start(spec).await.unwrap();
    let ks = create_keyspace(&**c.meta(), "users", Routing::Range, None)
        .await
        .unwrap();
    // Every node at the map with the keyspace before the client reads one
    // (it asks a node for the map; one still at the older map would not
    // know "users": the suite once failed so, 2026-12-06).
    c.wait_serving(WAIT).await.unwrap();
    let seeds: Vec<String> = c.resp_addrs().into_iter().flatten().collect();
    let seed_refs: Vec<&str> = seeds.iter().map(|s| s.as_str()).collect();
    let client = Client::connect(&seed_refs, ClientConfig::default())
        .await
        .unwrap();
    for i in 0..KEYS {
        client
            .kw_set("users", key(i).as_bytes(), value(i).as_bytes())
            .await
            .unwrap();
    }

    // Scanners: one per node, each through its own node only.
    let stop = Arc::new(AtomicBool::new(false));
    let scans = Arc::new(AtomicU64::new(0));
    let scanners: Vec<_> = seeds
        .iter()
        .cloned()
        .map(|addr| {
            let (stop, scans) = (stop.clone(), scans.clone());
            tokio::spawn(async move {
                let mut conn = Conn::connect(&addr).await;
                let mut done = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let scan = full_scan(&mut conn).await;
                    if let Err(e) = scan.and_then(|s| check(&s)) {
                        return Err(format!("scan {done} through {addr}: {e}"));
                    }
                    done += 1;
                    scans.fetch_add(1, Ordering::Relaxed);
                }
                Ok(done)
            })
        })
        .collect();

    let began = Instant::now();
    for round in 1..=ROUNDS {
        let before = scans.load(Ordering::Relaxed);
        let what = churn_round(&c, ks.id, &mut rng).await;
        println!(
            "round {round}: {what} ({} full scans meanwhile)",
            scans.load(Ordering::Relaxed) - before
        );
    }
    let during = scans.load(Ordering::Relaxed);
    stop.store(true, Ordering::SeqCst);
    for s in scanners {
        let done = s.await.unwrap().unwrap_or_else(|e| panic!("{e}"));
        assert!(done > 0, "a scanner finished no scan");
    }
    let map = c.map().await.unwrap();
    let parts = partitions(&map, ks.id);
    let owners: std::collections::BTreeSet<NodeId> = parts.iter().map(|p| p.owner).collect();
    println!(
        "{during} full scans of {KEYS} keys during {ROUNDS} rounds ({:?}); now {} partitions on {} nodes",
        began.elapsed(),
        parts.len(),
        owners.len()
    );
    assert!(
        during >= 2 * ROUNDS as u64,
        "too few scans overlapped the churn: {during}"
    );
    assert!(parts.len() > 1, "no split happened");
    c.shutdown().await;
}
