//! `keyway ctl split` of a hash partition under live traffic: a Redis-style
//! RESP client (no epochs) sees no error at all (the owner keeps both
//! halves, so there is nothing to redirect), and a smart client holding the
//! parent's epoch is rejected once, patches its cache and converges.
//! Then `keyway ctl merge` puts the halves back together, the same way.

use bytes::{Bytes, BytesMut};
use keyway_client::{Client, ClientConfig};
use keyway_cluster::{ClusterSpec, LocalCluster};
use keyway_map::{DEFAULT_KEYSPACE, Epoch, PartitionRecord, key_hash_slot};
use keyway_resp::{Frame, Limits, Protocol, ResponseParser, encode};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const DEADLINE: Duration = Duration::from_secs(30);

/// One plain RESP connection, as a Redis client holds to a slot's owner.
struct Resp {
    conn: TcpStream,
    parser: ResponseParser,
    buf: BytesMut,
}

impl Resp {
    async fn connect(addr: &str) -> Resp {
        Resp {
            conn: TcpStream::connect(addr).await.unwrap(),
            parser: ResponseParser::new(Limits::default()),
            buf: BytesMut::new(),
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
        self.conn.write_all(&out).await.unwrap();
        loop {
            if let Some(f) = self.parser.parse(&mut self.buf).unwrap() {
                return f;
            }
            assert!(
                self.conn.read_buf(&mut self.buf).await.unwrap() > 0,
                "connection closed"
            );
        }
    }
}

/// Runs `keyway ctl --meta URL args...`, returning its stdout.
async fn ctl(meta_url: &str, args: &[&str]) -> String {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_keyway"))
        .args(["ctl", "--meta", meta_url])
        .args(args)
        .env("KEYWAY_LOG", "warn")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "keyway ctl {args:?} failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Waits until `probe` holds, polling every 10 ms.
async fn until(what: &str, mut probe: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !probe() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A SET-then-GET loop over `keys` on one connection; counts operations
/// and any error reply or wrong value.
fn workload(
    addr: String,
    keys: Vec<String>,
    stop: Arc<AtomicBool>,
    ops: Arc<AtomicU64>,
) -> tokio::task::JoinHandle<Vec<String>> {
    tokio::spawn(async move {
        let mut conn = Resp::connect(&addr).await;
        let mut errors = Vec::new();
        let mut i = 0u64;
        while !stop.load(Ordering::SeqCst) {
            let key = keys[i as usize % keys.len()].as_bytes();
            let value = format!("v{i}");
            match conn.cmd(&[b"SET", key, value.as_bytes()]).await {
                Frame::Simple(ok) if ok == "OK" => {}
                other => errors.push(format!("SET: {other:?}")),
            }
            match conn.cmd(&[b"GET", key]).await {
                Frame::Bulk(v) if v == value.as_bytes() => {}
                other => errors.push(format!("GET: {other:?}")),
            }
            ops.fetch_add(1, Ordering::SeqCst);
            i += 1;
        }
        errors
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_split_under_load_is_invisible_to_redis_clients_and_redirects_smart_ones() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = ClusterSpec::ephemeral(3, dir.path().to_path_buf());
    spec.node.lease_ttl_ms = 60_000;
    let c = LocalCluster::start(spec).await.unwrap();
    let url = c.meta_url();
    let map = c.map().await.unwrap();
    let parent: PartitionRecord = map
        .locate_slot(DEFAULT_KEYSPACE, key_hash_slot(b"split-me"))
        .unwrap()
        .clone();
    let (first, last) = parent.slot_span();
    let keys: Vec<String> = (0..100_000)
        .map(|i| format!("k{i}"))
        .filter(|k| (first..=last).contains(&key_hash_slot(k.as_bytes())))
        .take(300)
        .collect();
    let owner_addr = map.nodes[&parent.owner].resp_addr.clone();

    // A smart client that cached the map (the parent at its epoch) before.
    let seeds: Vec<String> = c.resp_addrs().into_iter().flatten().collect();
    let seeds: Vec<&str> = seeds.iter().map(|s| s.as_str()).collect();
    let smart = Client::connect(&seeds, ClientConfig::default())
        .await
        .unwrap();
    smart.set(keys[0].as_bytes(), b"before").await.unwrap();
    assert_eq!(smart.stats().rejections, 0);

    let (stop, ops) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let load = workload(owner_addr, keys.clone(), stop.clone(), ops.clone());
    until("the workload to run", || ops.load(Ordering::SeqCst) >= 200).await;

    let out = ctl(&url, &["split", &parent.id.to_string()]).await;
    let after = c.map().await.unwrap();
    assert!(!after.partitions.contains_key(&parent.id), "{out}");
    let mid = first + (last - first).div_ceil(2);
    let left = after.locate_slot(DEFAULT_KEYSPACE, first).unwrap().clone();
    let right = after.locate_slot(DEFAULT_KEYSPACE, last).unwrap().clone();
    assert_eq!(left.slot_span(), (first, mid - 1));
    assert_eq!(right.slot_span(), (mid, last));
    for child in [&left, &right] {
        assert_eq!(child.owner, parent.owner, "a split moves nothing");
        assert_eq!(child.epoch, Epoch(parent.epoch.0 + 1));
        assert!(
            out.contains(&format!(
                "slots {}-{}",
                child.slot_span().0,
                child.slot_span().1
            )),
            "{out}"
        );
    }
    c.wait_serving(DEADLINE).await.unwrap();
    let installed = ops.load(Ordering::SeqCst);
    until("the workload to run on the split map", || {
        ops.load(Ordering::SeqCst) >= installed + 200
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    let errors = load.await.unwrap();
    assert!(errors.is_empty(), "the RESP client saw: {errors:?}");

    // The smart client still names the parent at its epoch: one rejection
    // carrying a child's record, patched, and the answer.
    let in_left = keys
        .iter()
        .find(|k| {
            left.slot_span().0 <= key_hash_slot(k.as_bytes()) && key_hash_slot(k.as_bytes()) < mid
        })
        .unwrap();
    let in_right = keys
        .iter()
        .find(|k| key_hash_slot(k.as_bytes()) >= mid)
        .unwrap();
    smart.set(in_left.as_bytes(), b"smart").await.unwrap();
    assert_eq!(smart.stats().rejections, 1);
    assert!(
        smart.get(in_right.as_bytes()).await.unwrap().is_some(),
        "the workload wrote every key"
    );
    let converged = smart.stats();
    let cached = smart.map();
    for child in [&left, &right] {
        let p = cached
            .locate_slot(DEFAULT_KEYSPACE, child.slot_span().0)
            .unwrap();
        assert_eq!((p.id, p.epoch), (child.id, child.epoch));
    }
    for k in keys.iter().take(50) {
        smart.get(k.as_bytes()).await.unwrap();
    }
    assert_eq!(
        smart.stats().rejections,
        converged.rejections,
        "converged: no more rejections"
    );

    // And back: one merge, same owner, a fresh id one epoch above both.
    let out = ctl(
        &url,
        &["merge", &left.id.to_string(), &right.id.to_string()],
    )
    .await;
    let merged = c.map().await.unwrap();
    let whole = merged.locate_slot(DEFAULT_KEYSPACE, first).unwrap();
    assert_eq!(whole.slot_span(), (first, last), "{out}");
    assert_eq!(
        (whole.owner, whole.epoch),
        (parent.owner, Epoch(parent.epoch.0 + 2))
    );
    assert!(whole.id > right.id);
    c.wait_serving(DEADLINE).await.unwrap();
    assert_eq!(
        smart.get(in_left.as_bytes()).await.unwrap(),
        Some(Bytes::from_static(b"smart"))
    );
    c.shutdown().await;
}

/// The body of a 200 answer to `GET path` (HTTP/1.0: the reply ends with
/// the connection).
async fn http_get(addr: &str, path: &str) -> String {
    let mut conn = TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    conn.write_all(request.as_bytes()).await.unwrap();
    let mut reply = Vec::new();
    conn.read_to_end(&mut reply).await.unwrap();
    let reply = String::from_utf8(reply).unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").unwrap();
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{head}"
    );
    body.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_partition_splits_by_itself_but_one_hot_key_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = ClusterSpec::ephemeral(3, dir.path().to_path_buf());
    spec.node.lease_ttl_ms = 60_000;
    spec.node.stats_window_ms = 1_000;
    spec.node.stats_sample_every = 1;
    let mut manager = keyway_cluster::ManagerSpec::default();
    manager.config.monitor.stats_interval_ms = 200;
    manager.config.monitor.stats_timeout_ms = 200;
    manager.config.split.split_max_requests_per_sec = 200.0;
    manager.config.split.split_load_window_ms = 1_000;
    manager.config.merge.merge_max_requests_per_sec = 10.0;
    spec.manager = Some(manager);
    let c = LocalCluster::start(spec).await.unwrap();
    let admin = c.manager().unwrap().admin_addr().to_string();
    let map = c.map().await.unwrap();
    let hot = map
        .locate_slot(DEFAULT_KEYSPACE, key_hash_slot(b"spread"))
        .unwrap()
        .clone();
    let one_key = map
        .partitions
        .values()
        .find(|p| p.id != hot.id && p.owner != hot.owner)
        .unwrap()
        .clone();
    let (first, last) = hot.slot_span();
    let spread: Vec<String> = (0..100_000)
        .map(|i| format!("s{i}"))
        .filter(|k| (first..=last).contains(&key_hash_slot(k.as_bytes())))
        .take(500)
        .collect();
    let (qf, ql) = one_key.slot_span();
    let celebrity = (0..100_000)
        .map(|i| format!("celebrity{i}"))
        .find(|k| (qf..=ql).contains(&key_hash_slot(k.as_bytes())))
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (ops_a, ops_b) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let addr = |p: &PartitionRecord| map.nodes[&p.owner].resp_addr.clone();
    let a = workload(addr(&hot), spread, stop.clone(), ops_a);
    let b = workload(addr(&one_key), vec![celebrity], stop.clone(), ops_b);

    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let (mut split, mut single) = (None, None);
    while split.is_none() || single.is_none() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no split of {} (found {split:?}) or no single_key hold of {} (found {single:?}): {}",
            hot.id,
            one_key.id,
            http_get(&admin, "/decisions").await
        );
        let decisions: Vec<serde_json::Value> =
            serde_json::from_str(&http_get(&admin, "/decisions").await).unwrap();
        let find = |reason: &str, p: &PartitionRecord| {
            decisions
                .iter()
                .find(|d| d["reason"] == reason && d["partition"] == p.id.0)
                .cloned()
        };
        split = split.or(find("load", &hot));
        single = single.or(find("single_key", &one_key));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::SeqCst);
    for task in [a, b] {
        let errors = task.await.unwrap();
        assert!(errors.is_empty(), "the RESP clients saw: {errors:?}");
    }
    assert_eq!(split.unwrap()["acted"], true);
    let now = c.map().await.unwrap();
    assert!(!now.partitions.contains_key(&hot.id), "split by load");
    assert!(
        now.partitions.contains_key(&one_key.id),
        "never split for one key"
    );
    let text = http_get(&admin, "/metrics").await;
    assert!(
        text.contains(r#"keyway_manager_splits_total{reason="load"}"#),
        "{text}"
    );
    assert!(
        text.contains(r#"keyway_manager_splits_skipped_total{reason="single_key"}"#),
        "{text}"
    );
    // `keyway ctl decisions` shows both.
    let table = ctl(
        &c.meta_url(),
        &["decisions", "--manager-admin", &admin, "--duty", "split"],
    )
    .await;
    assert!(
        table.contains("single_key") && table.contains("load"),
        "{table}"
    );
    c.shutdown().await;
}
