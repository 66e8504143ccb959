//! Transactions against live moves: `MULTI; INCR {t}a; INCR {t}b; EXEC`
//! from two clients while the partition holding `{t}` moves back and forth
//! between two nodes. An `EXEC` runs as one storage task with one apply
//! batch (`keyway_node::multi`), so a migration's cutover sees each
//! transaction wholly or redirects it (`-MOVED`, or `-EXECABORT` after a
//! queue-time `-MOVED`); never half of it. Checked: every read (`MGET`,
//! and `MULTI; GET; GET; EXEC`) sees `a == b`; every acknowledged `EXEC`
//! saw `a == b` after its two increments; at the end `a == b == ` the
//! number of acknowledged `EXEC`s (a redirected `EXEC` did nothing, an
//! acknowledged one was not lost).
//!
//! The second test drives redis-py's `RedisCluster.pipeline(transaction=True)`
//! and `WATCH` against a one-node cluster (`tests/py/multi_tx.py`).
//!
//! `KEYWAY_TEST_LOG=info` turns the cluster's logs on.

use crate::common;

use common::workload::{ctl_json, read_map};
use common::{DevCluster, Resp, run};
use keyway_resp::Frame;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const MOVES: usize = 8;
const WRITERS: usize = 2;

/// A connection that follows `-MOVED` to the slot's new owner.
struct Follower {
    conn: Resp,
    redirects: Arc<AtomicU64>,
}

impl Follower {
    fn new(port: u16, redirects: Arc<AtomicU64>) -> Self {
        Follower {
            conn: Resp::connect(port),
            redirects,
        }
    }

    /// Follows a `MOVED slot host:port` error; `true` if it was one.
    fn follow(&mut self, frame: &Frame) -> bool {
        let Frame::Error(e) = frame else {
            return false;
        };
        let Some(rest) = e.strip_prefix("MOVED ") else {
            return false;
        };
        let port: u16 = rest
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("bad MOVED {e}"));
        self.conn = Resp::connect(port);
        self.redirects.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Sends `cmds` pipelined on one connection, returns every reply.
    fn pipeline(&mut self, cmds: &[&[&str]]) -> Vec<Frame> {
        let mut out = bytes::BytesMut::new();
        for c in cmds {
            let frame = Frame::Array(
                c.iter()
                    .map(|a| Frame::Bulk(bytes::Bytes::copy_from_slice(a.as_bytes())))
                    .collect(),
            );
            keyway_resp::encode(&frame, keyway_resp::Protocol::Resp2, &mut out);
        }
        self.conn.send_raw(&out).expect("send pipeline");
        cmds.iter()
            .map(|_| self.conn.read_reply().expect("reply"))
            .collect()
    }
}

fn int(f: &Frame) -> i64 {
    match f {
        Frame::Integer(n) => *n,
        Frame::Bulk(b) => std::str::from_utf8(b).unwrap().parse().unwrap(),
        Frame::Null => 0,
        other => panic!("not a number: {other:?}"),
    }
}

/// Whether an error leaves the transaction certainly unapplied and worth
/// retrying: a redirect, a queue-time redirect's EXECABORT, a fence held
/// too long, a lease gap.
fn retryable(e: &str) -> bool {
    e.starts_with("MOVED")
        || e.starts_with("EXECABORT")
        || e.starts_with("TRYAGAIN")
        || e.starts_with("CLUSTERDOWN")
        || e.contains("held")
}

#[test]
fn transactions_are_whole_or_redirected_across_live_moves() {
    let dir = tempfile::tempdir().unwrap();
    let log = std::env::var("KEYWAY_TEST_LOG").unwrap_or_else(|_| "warn".into());
    let cluster = DevCluster::start(
        2,
        &dir.path().join("data"),
        &[
            "--migration-cleanup-grace-ms",
            "200",
            "--no-rebalance",
            "--log",
            &log,
        ],
    );
    let meta = format!("keyway://127.0.0.1:{}", cluster.base());
    let port = cluster.ports()[0];
    let slot = int(&Resp::connect(port).cmd(&["CLUSTER", "KEYSLOT", "{t}"])) as u16;
    let partition = partition_of(&meta, slot);

    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let redirects = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    for _ in 0..WRITERS {
        let (stop, acked, redirects, refused) = (
            stop.clone(),
            acked.clone(),
            redirects.clone(),
            refused.clone(),
        );
        threads.push(std::thread::spawn(move || {
            let mut c = Follower::new(port, redirects);
            while !stop.load(Ordering::Relaxed) {
                let replies =
                    c.pipeline(&[&["MULTI"], &["INCR", "{t}a"], &["INCR", "{t}b"], &["EXEC"]]);
                match &replies[3] {
                    Frame::Array(r) => {
                        assert_eq!(r.len(), 2, "EXEC reply {replies:?}");
                        assert_eq!(int(&r[0]), int(&r[1]), "a transaction saw a != b: {r:?}");
                        acked.fetch_add(1, Ordering::Relaxed);
                    }
                    Frame::Error(e) if retryable(e) => {
                        refused.fetch_add(1, Ordering::Relaxed);
                        // The redirect is in the EXEC reply or a queued one.
                        if !replies.iter().any(|f| c.follow(f)) {
                            std::thread::sleep(Duration::from_millis(5));
                        }
                    }
                    other => panic!("unexpected EXEC reply {other:?} in {replies:?}"),
                }
            }
        }));
    }
    let reads = Arc::new(AtomicU64::new(0));
    {
        let (stop, reads, redirects) = (stop.clone(), reads.clone(), redirects.clone());
        threads.push(std::thread::spawn(move || {
            let mut c = Follower::new(port, redirects);
            let mut tx = false;
            while !stop.load(Ordering::Relaxed) {
                tx = !tx;
                let (a, b) = if tx {
                    let r =
                        c.pipeline(&[&["MULTI"], &["GET", "{t}a"], &["GET", "{t}b"], &["EXEC"]]);
                    match &r[3] {
                        Frame::Array(v) => (int(&v[0]), int(&v[1])),
                        _ => {
                            if !r.iter().any(|f| c.follow(f)) {
                                std::thread::sleep(Duration::from_millis(5));
                            }
                            continue;
                        }
                    }
                } else {
                    let r = c.pipeline(&[&["MGET", "{t}a", "{t}b"]]);
                    match &r[0] {
                        Frame::Array(v) => (int(&v[0]), int(&v[1])),
                        f => {
                            if !c.follow(f) {
                                std::thread::sleep(Duration::from_millis(5));
                            }
                            continue;
                        }
                    }
                };
                assert_eq!(a, b, "a read saw a half-applied transaction");
                reads.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }

    let began = Instant::now();
    move_back_and_forth(&meta, partition, MOVES, &acked);
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("a client thread failed");
    }
    let mut c = Follower::new(port, redirects.clone());
    let final_ab = loop {
        let r = c.pipeline(&[&["MGET", "{t}a", "{t}b"]]);
        if let Frame::Array(v) = &r[0] {
            break (int(&v[0]), int(&v[1]));
        }
        assert!(c.follow(&r[0]), "final read: {r:?}");
    };
    let acked = acked.load(Ordering::Relaxed);
    println!(
        "{MOVES} moves in {:?}: {acked} EXECs acknowledged, {} refused and retried, {} redirects followed, {} consistent reads; final a={} b={}",
        began.elapsed(),
        refused.load(Ordering::Relaxed),
        redirects.load(Ordering::Relaxed),
        reads.load(Ordering::Relaxed),
        final_ab.0,
        final_ab.1
    );
    assert_eq!(final_ab.0, final_ab.1, "a != b at the end");
    assert_eq!(
        final_ab.0 as u64, acked,
        "the counters differ from the acknowledged transactions (a redirected EXEC applied, or an acknowledged one was lost)"
    );
    assert!(
        redirects.load(Ordering::Relaxed) >= MOVES as u64,
        "the clients followed fewer redirects than there were moves"
    );
}

/// The partition holding `slot` (from `keyway ctl map --json`).
fn partition_of(meta: &str, slot: u16) -> u64 {
    let map = ctl_json(meta, &["map"]);
    let hex = |v: &serde_json::Value| {
        u16::from_str_radix(v.as_str().unwrap_or(""), 16).unwrap_or(u16::MAX)
    };
    map["partitions"]
        .as_object()
        .unwrap()
        .values()
        .find(|p| {
            let (start, end) = (hex(&p["start"]), hex(&p["end"]));
            start <= slot && (slot < end || p["end"].as_str() == Some(""))
        })
        .map(|p| p["id"].as_u64().unwrap())
        .expect("the partition of the slot")
}

/// Moves `partition` to the other node `moves` times, waiting after each
/// move until `progress` grew by 50 (transactions ran on the new owner).
fn move_back_and_forth(meta: &str, partition: u64, moves: usize, progress: &AtomicU64) {
    for n in 1..=moves {
        let (partitions, nodes) = read_map(meta);
        let owner = partitions[&partition];
        let (target, to) = nodes
            .iter()
            .find(|(id, _)| **id != owner)
            .map(|(id, a)| (*id, a.clone()))
            .expect("a second node");
        let before = progress.load(Ordering::Relaxed);
        let out = Command::new(env!("CARGO_BIN_EXE_keyway"))
            .args(["ctl", "--meta", meta, "move", &partition.to_string()])
            .args(["--to", &to, "--wait", "--timeout-secs", "60"])
            .env("KEYWAY_LOG", "warn")
            .output()
            .expect("run keyway ctl move");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains(" DONE"),
            "move {n}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while progress.load(Ordering::Relaxed) < before + 50 {
            assert!(
                Instant::now() < deadline,
                "no transactions acknowledged after move {n}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        println!(
            "move {n}/{moves}: partition {partition} node {owner} -> node {target}; {} transactions acknowledged so far",
            progress.load(Ordering::Relaxed)
        );
    }
}

/// The same through `keyway proxy` (which sends each transaction to the
/// slot's owner as one epoch-checked request): `MULTI; INCR; INCR; EXEC`
/// writers, an `MGET` reader, and a `WATCH`-based compare-and-set loop
/// (`WATCH c; GET c; MULTI; SET c v+1; EXEC`, retried on nil), across live
/// moves. The proxy follows redirects itself, so every `EXEC` is answered;
/// a `WATCH`ed one whose partition moved meanwhile is nil (retried). At the
/// end `a == b ==` the acknowledged increments and `c ==` the acknowledged
/// compare-and-sets: no transaction was half-applied, lost or applied twice.
#[test]
fn transactions_through_the_proxy_are_whole_across_live_moves() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = DevCluster::start(
        2,
        &dir.path().join("data"),
        &["--migration-cleanup-grace-ms", "200", "--no-rebalance"],
    );
    let meta = format!("keyway://127.0.0.1:{}", cluster.base());
    let base = common::free_port_block(2);
    let args: Vec<String> = [
        "proxy",
        "--meta",
        &meta,
        "--listen",
        &format!("127.0.0.1:{base}"),
        "--admin-listen",
        &format!("127.0.0.1:{}", base + 1),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let _proxy = common::Proc::spawn(&args, "serving");
    let port = base;
    let slot = int(&Resp::connect(cluster.ports()[0]).cmd(&["CLUSTER", "KEYSLOT", "{t}"])) as u16;
    let partition = partition_of(&meta, slot);

    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let cas_ok = Arc::new(AtomicU64::new(0));
    let cas_retries = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    for _ in 0..WRITERS {
        let (stop, acked) = (stop.clone(), acked.clone());
        threads.push(std::thread::spawn(move || {
            let mut c = Follower::new(port, Arc::new(AtomicU64::new(0)));
            while !stop.load(Ordering::Relaxed) {
                let r = c.pipeline(&[&["MULTI"], &["INCR", "{t}a"], &["INCR", "{t}b"], &["EXEC"]]);
                match &r[3] {
                    Frame::Array(v) if v.len() == 2 => {
                        assert_eq!(int(&v[0]), int(&v[1]), "a transaction saw a != b");
                        acked.fetch_add(1, Ordering::Relaxed);
                    }
                    other => panic!("EXEC through the proxy answered {other:?} ({r:?})"),
                }
            }
        }));
    }
    {
        let (stop, cas_ok, cas_retries) = (stop.clone(), cas_ok.clone(), cas_retries.clone());
        threads.push(std::thread::spawn(move || {
            let mut c = Follower::new(port, Arc::new(AtomicU64::new(0)));
            while !stop.load(Ordering::Relaxed) {
                let r = c.pipeline(&[&["WATCH", "{t}c"], &["GET", "{t}c"]]);
                assert_eq!(r[0], Frame::ok(), "WATCH through the proxy");
                let v = int(&r[1]);
                let next = (v + 1).to_string();
                let r = c.pipeline(&[&["MULTI"], &["SET", "{t}c", &next], &["EXEC"]]);
                match &r[2] {
                    Frame::Array(_) => {
                        cas_ok.fetch_add(1, Ordering::Relaxed);
                    }
                    Frame::NullArray => {
                        cas_retries.fetch_add(1, Ordering::Relaxed);
                    }
                    other => panic!("a compare-and-set EXEC answered {other:?}"),
                }
            }
        }));
    }
    {
        let stop = stop.clone();
        threads.push(std::thread::spawn(move || {
            let mut c = Follower::new(port, Arc::new(AtomicU64::new(0)));
            while !stop.load(Ordering::Relaxed) {
                let r = c.pipeline(&[&["MGET", "{t}a", "{t}b"]]);
                let Frame::Array(v) = &r[0] else {
                    panic!("MGET through the proxy answered {r:?}")
                };
                assert_eq!(
                    int(&v[0]),
                    int(&v[1]),
                    "a read saw a half-applied transaction"
                );
            }
        }));
    }
    move_back_and_forth(&meta, partition, 6, &acked);
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("a client thread failed");
    }
    let mut c = Follower::new(port, Arc::new(AtomicU64::new(0)));
    let r = c.pipeline(&[&["MGET", "{t}a", "{t}b", "{t}c"]]);
    let Frame::Array(v) = &r[0] else {
        panic!("{r:?}")
    };
    let (a, b, cv) = (int(&v[0]), int(&v[1]), int(&v[2]));
    let (acked, cas_ok) = (
        acked.load(Ordering::Relaxed),
        cas_ok.load(Ordering::Relaxed),
    );
    println!(
        "through the proxy: {acked} EXECs, {cas_ok} compare-and-sets ({} retried on nil); final a={a} b={b} c={cv}",
        cas_retries.load(Ordering::Relaxed)
    );
    assert_eq!((a as u64, b as u64), (acked, acked));
    assert_eq!(
        cv as u64, cas_ok,
        "a compare-and-set was lost or applied twice"
    );
    assert!(cas_ok > 0);
}

#[test]
fn redis_py_cluster_transactions_and_watch() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = DevCluster::start(1, &dir.path().join("data"), &[]);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/multi_tx.py");
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let out = run(Command::new(python).args([script, &cluster.ports()[0].to_string()]));
    assert!(out.contains("multi_tx ok"), "{out}");
}
