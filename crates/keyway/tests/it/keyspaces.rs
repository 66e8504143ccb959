//! Range keyspaces in use: created by `create_keyspace` / `keyway ctl
//! keyspace`, split over three nodes, written through one node (non-owners
//! answer `-KWMOVED`), read back in key order by `KW.SCAN` from every node
//! in `LIMIT` pages whose concatenation is one full scan; the scan continues
//! across a split and a live move made between its pages; `RangeScan`
//! refuses a stale epoch with the newer record; Redis `SCAN`/`DBSIZE` never
//! see another keyspace; the real `redis-cli` speaks the `KW.*` commands.

use crate::common;

use bytes::{Bytes, BytesMut};
use common::{DevCluster, redis_cli, run};
use keyway_client::{Client, ClientConfig, parse_kwmoved};
use keyway_cluster::{ClusterSpec, LocalCluster};
use keyway_map::{
    Epoch, KeyspaceId, MapChange, NodeId, OwnershipCondition, PartitionId, PartitionRecord,
    Routing, to_hex,
};
use keyway_meta::MapTxn;
use keyway_resp::{Frame, Limits, ResponseParser, encode_command};
use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const WAIT: Duration = Duration::from_secs(30);
const KEYS: usize = 3000;

fn key(i: usize) -> String {
    format!("key{i:05}")
}

fn value(i: usize) -> String {
    format!("value-{i}")
}

/// A pipelining RESP connection.
struct Conn {
    stream: TcpStream,
    buf: BytesMut,
    parser: ResponseParser,
}

impl Conn {
    async fn connect(addr: &str) -> Conn {
        Conn {
            stream: TcpStream::connect(addr).await.expect("connect"),
            buf: BytesMut::new(),
            parser: ResponseParser::new(Limits::default()),
        }
    }

    /// Sends every request, then reads as many replies (in chunks, so
    /// neither side's socket buffer fills up).
    async fn pipeline(&mut self, reqs: &[Vec<Bytes>]) -> Vec<Frame> {
        let mut out = Vec::with_capacity(reqs.len());
        for chunk in reqs.chunks(500) {
            let mut wire = BytesMut::new();
            for r in chunk {
                encode_command(r, &mut wire);
            }
            self.stream.write_all(&wire).await.expect("write");
            for _ in chunk {
                out.push(self.read().await);
            }
        }
        out
    }

    async fn cmd(&mut self, args: &[&str]) -> Frame {
        let req: Vec<Bytes> = args
            .iter()
            .map(|a| Bytes::copy_from_slice(a.as_bytes()))
            .collect();
        self.pipeline(&[req]).await.remove(0)
    }

    async fn read(&mut self) -> Frame {
        loop {
            if let Some(f) = self.parser.parse(&mut self.buf).expect("valid RESP") {
                return f;
            }
            let n = tokio::time::timeout(WAIT, self.stream.read_buf(&mut self.buf))
                .await
                .expect("reply in time")
                .expect("read");
            assert!(n > 0, "connection closed");
        }
    }
}

fn req(args: &[&[u8]]) -> Vec<Bytes> {
    args.iter().map(|a| Bytes::copy_from_slice(a)).collect()
}

fn bulk(s: &str) -> Frame {
    Frame::Bulk(Bytes::copy_from_slice(s.as_bytes()))
}

fn err_text(f: &Frame) -> &str {
    match f {
        Frame::Error(e) => e,
        other => panic!("expected an error, got {other:?}"),
    }
}

async fn cluster(dir: &std::path::Path, manager: bool) -> LocalCluster {
    let mut spec = ClusterSpec::ephemeral(3, dir.to_path_buf());
    spec.node.lease_ttl_ms = 60_000;
    if !manager {
        spec.manager = None;
    }
    LocalCluster::start(spec).await.expect("cluster starts")
}

/// Replaces the keyspace's partition holding `at` by children cut at `cuts`
/// (metadata only, new ids, epoch + 1), owned by `owners` in order.
async fn split(
    c: &LocalCluster,
    ks: KeyspaceId,
    at: &[u8],
    cuts: &[&str],
    owners: &[NodeId],
) -> Vec<PartitionRecord> {
    let map = c.map().await.unwrap();
    let p = map.locate(ks, at).unwrap().clone();
    let first = map.next_partition_id.0;
    let mut bounds: Vec<Bytes> = vec![p.start.clone()];
    bounds.extend(cuts.iter().map(|c| Bytes::copy_from_slice(c.as_bytes())));
    let children: Vec<PartitionRecord> = (0..bounds.len())
        .map(|i| PartitionRecord {
            id: PartitionId(first + i as u64),
            start: bounds[i].clone(),
            end: bounds.get(i + 1).cloned().or_else(|| p.end.clone()),
            owner: owners[i],
            epoch: Epoch(p.epoch.0 + 1),
            ..p.clone()
        })
        .collect();
    let mut txn = MapTxn {
        conditions: vec![OwnershipCondition {
            partition: p.id,
            expected: Some((p.owner, p.epoch)),
        }],
        changes: vec![MapChange::RemovePartition { id: p.id }],
    };
    for child in &children {
        txn.conditions.push(OwnershipCondition {
            partition: child.id,
            expected: None,
        });
        txn.changes.push(MapChange::UpsertPartition(child.clone()));
    }
    txn.changes.push(MapChange::ReservePartitionIds {
        next: PartitionId(first + children.len() as u64),
    });
    c.meta().commit(txn).await.expect("split commits");
    c.wait_serving(WAIT).await.unwrap();
    children
}

/// One `KW.SCAN` call: (cursor, entries).
async fn scan(conn: &mut Conn, args: &[&str]) -> (Option<Bytes>, Vec<(Bytes, Bytes)>) {
    let mut full = vec!["KW.SCAN"];
    full.extend_from_slice(args);
    match conn.cmd(&full).await {
        Frame::Array(parts) if parts.len() == 2 => {
            let cursor = match &parts[0] {
                Frame::Bulk(c) => Some(c.clone()),
                Frame::Null => None,
                other => panic!("bad cursor {other:?}"),
            };
            let Frame::Array(flat) = &parts[1] else {
                panic!("bad entries {:?}", parts[1])
            };
            let entries = flat
                .chunks(2)
                .map(|kv| match kv {
                    [Frame::Bulk(k), Frame::Bulk(v)] => (k.clone(), v.clone()),
                    other => panic!("bad entry {other:?}"),
                })
                .collect();
            (cursor, entries)
        }
        other => panic!("KW.SCAN {args:?} answered {other:?}"),
    }
}

/// Pages through `[start, end)` with `limit`; checks every page's size and
/// that cursors only grow; returns the concatenation.
async fn scan_pages(
    conn: &mut Conn,
    ks: &str,
    start: &str,
    end: &str,
    limit: usize,
) -> Vec<(Bytes, Bytes)> {
    let mut out: Vec<(Bytes, Bytes)> = Vec::new();
    let mut cursor = Bytes::copy_from_slice(start.as_bytes());
    let limit_text = limit.to_string();
    loop {
        let c = String::from_utf8(cursor.to_vec()).unwrap();
        let (next, page) = scan(conn, &[ks, &c, end, "LIMIT", &limit_text]).await;
        assert!(
            page.len() <= limit,
            "page of {} > LIMIT {limit}",
            page.len()
        );
        if let Some(first) = page.first() {
            assert!(first.0 >= cursor, "page starts before its cursor");
        }
        out.extend(page);
        match next {
            Some(n) => {
                assert!(n > cursor, "cursor went backwards or stood still");
                cursor = n;
            }
            None => return out,
        }
    }
}

fn expected(range: std::ops::Range<usize>) -> Vec<(Bytes, Bytes)> {
    range
        .map(|i| (Bytes::from(key(i)), Bytes::from(value(i))))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kw_commands_and_an_ordered_scan_across_three_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(dir.path(), false).await;
    let ks = keyway_manager::create_keyspace(&**c.meta(), "events", Routing::Range, None)
        .await
        .unwrap();
    let ids: Vec<NodeId> = c.node_ids().into_iter().flatten().collect();
    let parts = split(&c, ks.id, b"", &["key01000", "key02000"], &ids).await;
    let addrs: Vec<String> = c.resp_addrs().into_iter().flatten().collect();

    // Every write through node 0; the other nodes' keys come back KWMOVED
    // and are re-sent to the owner the rejection names.
    let mut via0 = Conn::connect(&addrs[0]).await;
    let writes: Vec<Vec<Bytes>> = (0..KEYS)
        .map(|i| req(&[b"KW.SET", b"events", key(i).as_bytes(), value(i).as_bytes()]))
        .collect();
    let replies = via0.pipeline(&writes).await;
    let mut redirected: BTreeMap<String, Vec<Vec<Bytes>>> = BTreeMap::new();
    for (i, reply) in replies.iter().enumerate() {
        match reply {
            Frame::Simple(ok) if ok == "OK" => assert!(i < 1000, "key {i} is not node 0's"),
            Frame::Error(e) => {
                let moved = parse_kwmoved(e).unwrap_or_else(|| panic!("not KWMOVED: {e}"));
                let p = &parts[i / 1000];
                assert_eq!(
                    (
                        moved.partition.id,
                        moved.partition.epoch,
                        moved.partition.owner
                    ),
                    (p.id, p.epoch, p.owner)
                );
                assert_eq!(moved.partition.keyspace, ks.id);
                redirected
                    .entry(moved.owner_addr)
                    .or_default()
                    .push(writes[i].clone());
            }
            other => panic!("KW.SET {i}: {other:?}"),
        }
    }
    assert_eq!(redirected.values().map(Vec::len).sum::<usize>(), 2000);
    for (addr, reqs) in &redirected {
        let replies = Conn::connect(addr).await.pipeline(reqs).await;
        assert!(replies.iter().all(|r| *r == Frame::Simple("OK".into())));
    }

    // The rejection's exact format.
    let moved = via0.cmd(&["KW.GET", "events", "key02500"]).await;
    let p = &parts[2];
    assert_eq!(
        err_text(&moved),
        format!(
            "KWMOVED {} {} {} {} - {} {}",
            p.id,
            p.epoch,
            ks.id,
            to_hex(&p.start),
            p.owner,
            addrs[2]
        )
    );

    // From every node: pages concatenate to one full ordered scan.
    let all = expected(0..KEYS);
    for (n, addr) in addrs.iter().enumerate() {
        let mut conn = Conn::connect(addr).await;
        assert_eq!(
            scan_pages(&mut conn, "events", "", "", 257).await,
            all,
            "node {n}"
        );
        let (cursor, one) = scan(&mut conn, &["events", "", "", "LIMIT", "10000"]).await;
        assert_eq!((cursor, one.len()), (None, KEYS), "node {n}");
        // The numeric id works like the name.
        let bounded = scan_pages(&mut conn, &ks.id.to_string(), "key00500", "key02500", 333).await;
        assert_eq!(bounded, expected(500..2500), "node {n}");
    }
    let mut conn = Conn::connect(&addrs[1]).await;
    let (cursor, page) = scan(&mut conn, &["events", "key00998", "", "LIMIT", "4"]).await;
    assert_eq!(page, expected(998..1002), "a page spanning two nodes");
    assert_eq!(cursor.as_deref(), Some(&b"key01001\0"[..]));
    let (cursor, page) = scan(&mut conn, &["events", "key9", "key1"]).await;
    assert_eq!((cursor, page.len()), (None, 0), "start after end");

    // GET and DEL, on the owner.
    let mut owner2 = Conn::connect(&addrs[2]).await;
    assert_eq!(
        owner2.cmd(&["KW.GET", "events", "key02500"]).await,
        bulk("value-2500")
    );
    assert_eq!(
        owner2.cmd(&["KW.GET", "events", "key09999"]).await,
        Frame::Null
    );
    assert_eq!(
        owner2
            .cmd(&[
                "KW.DEL", "events", "key02001", "key02002", "key02001", "key09999"
            ])
            .await,
        Frame::Integer(2)
    );
    assert!(
        err_text(
            &owner2
                .cmd(&["KW.DEL", "events", "key02003", "key00001"])
                .await
        )
        .starts_with("CROSSSLOT")
    );
    assert_eq!(
        owner2.cmd(&["KW.GET", "events", "key02003"]).await,
        bulk("value-2003")
    );
    let after_del = scan_pages(&mut conn, "events", "key02000", "key02004", 10).await;
    assert_eq!(
        after_del.iter().map(|(k, _)| &k[..]).collect::<Vec<_>>(),
        [&b"key02000"[..], b"key02003"]
    );

    // Clear errors.
    for (args, want) in [
        (&["KW.GET", "nope", "k"][..], "ERR unknown keyspace 'nope'"),
        (
            &["KW.GET", "events"],
            "ERR wrong number of arguments for 'kw.get' command",
        ),
        (
            &["KW.SCAN", "events", "", "", "LIMIT", "0"],
            "ERR LIMIT must be an integer between 1 and 10000 (kw_scan_max_limit)",
        ),
        (
            &["KW.SCAN", "events", "", "", "MATCH", "x"],
            "ERR syntax error",
        ),
        (
            &["KW.SCAN", "default", "", ""],
            "ERR KW.SCAN needs a range keyspace; 'default' is a hash keyspace",
        ),
    ] {
        assert_eq!(err_text(&conn.cmd(args).await), want, "{args:?}");
    }

    // The smart client routes by keyspace and patches its cache from KWMOVED.
    let seeds: Vec<&str> = addrs.iter().map(|s| s.as_str()).collect();
    let client = Client::connect(&seeds, ClientConfig::default())
        .await
        .unwrap();
    client.kw_set("events", b"key01500", b"new").await.unwrap();
    assert_eq!(
        client.kw_get("events", b"key01500").await.unwrap(),
        Some(Bytes::from_static(b"new"))
    );
    assert_eq!(
        client
            .kw_del("events", &[b"key01500", b"key01501"])
            .await
            .unwrap(),
        2
    );
    assert_eq!(client.kw_get("events", b"key01500").await.unwrap(), None);
    let scanned = client
        .kw_scan_all("events", b"key01499", Some(b"key01503"), 2)
        .await
        .unwrap();
    assert_eq!(
        scanned.iter().map(|(k, _)| &k[..]).collect::<Vec<_>>(),
        [&b"key01499"[..], b"key01502"]
    );
    assert!(matches!(
        client.kw_get("nope", b"k").await,
        Err(keyway_client::ClientError::UnknownKeyspace(_))
    ));

    // Redis SCAN and DBSIZE cover keyspace 0 only.
    for i in 0..10 {
        client
            .set(format!("redis{i}").as_bytes(), b"v")
            .await
            .unwrap();
    }
    let mut dbsize = 0;
    let mut seen = Vec::new();
    for addr in &addrs {
        let mut conn = Conn::connect(addr).await;
        let Frame::Integer(n) = conn.cmd(&["DBSIZE"]).await else {
            panic!("DBSIZE")
        };
        dbsize += n;
        let mut cursor = "0".to_string();
        loop {
            let Frame::Array(parts) = conn.cmd(&["SCAN", &cursor, "COUNT", "1000"]).await else {
                panic!("SCAN")
            };
            let (Frame::Bulk(next), Frame::Array(keys)) = (&parts[0], &parts[1]) else {
                panic!("SCAN reply")
            };
            seen.extend(keys.iter().cloned());
            cursor = String::from_utf8(next.to_vec()).unwrap();
            if cursor == "0" {
                break;
            }
        }
    }
    assert_eq!(dbsize, 10, "DBSIZE counts keyspace 0 only");
    seen.sort_by_key(|f| format!("{f:?}"));
    let want: Vec<Frame> = (0..10).map(|i| bulk(&format!("redis{i}"))).collect();
    assert_eq!(seen, want, "SCAN returns keyspace 0's keys only");

    // KW.* on the hash keyspace 0 reads and writes what the Redis commands do.
    client.kw_set("default", b"kwfoo", b"bar").await.unwrap();
    assert_eq!(
        client.get(b"kwfoo").await.unwrap(),
        Some(Bytes::from_static(b"bar"))
    );
    assert_eq!(client.kw_del("0", &[b"redis1"]).await.unwrap(), 1, "by id");
    assert_eq!(client.get(b"redis1").await.unwrap(), None);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_continues_across_a_split_and_a_live_move_between_its_pages() {
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(dir.path(), true).await;
    let ks = keyway_manager::create_keyspace(&**c.meta(), "log", Routing::Range, None)
        .await
        .unwrap();
    c.wait_serving(WAIT).await.unwrap();
    let addrs: Vec<String> = c.resp_addrs().into_iter().flatten().collect();
    let seeds: Vec<&str> = addrs.iter().map(|s| s.as_str()).collect();
    let client = Client::connect(&seeds, ClientConfig::default())
        .await
        .unwrap();
    let n = 1200;
    for i in 0..n {
        client
            .kw_set("log", key(i).as_bytes(), value(i).as_bytes())
            .await
            .unwrap();
    }
    let mut conn = Conn::connect(&addrs[0]).await;
    let (cursor, mut got) = scan(&mut conn, &["log", "", "", "LIMIT", "300"]).await;
    let cursor = cursor.expect("more to come");

    // Split the (only) partition where the cursor sits, keeping its owner
    // (metadata only: the data stays where it is) ...
    let old = c
        .map()
        .await
        .unwrap()
        .locate(ks.id, &cursor)
        .unwrap()
        .clone();
    let children = split(&c, ks.id, &cursor, &["key00600"], &[old.owner, old.owner]).await;
    // ... and move the child holding the rest of the keys to another node, live.
    let target = *c
        .map()
        .await
        .unwrap()
        .nodes
        .keys()
        .find(|n| **n != old.owner)
        .unwrap();
    keyway_manager::request_move(&**c.meta(), children[1].id, target)
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let map = c.map().await.unwrap();
        if map.partitions[&children[1].id].owner == target {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the move did not finish"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    c.wait_serving(WAIT).await.unwrap();

    // RangeScan contract: the old (partition, epoch) is refused with the
    // record of the partition now covering the key.
    let map = c.map().await.unwrap();
    let admin = map.nodes[&old.owner].admin_addr.clone();
    let peer = keyway_peer::PeerClient::connect(&admin).unwrap();
    let route = keyway_node::kw::rpc::Route {
        record: old.clone(),
        admin_addr: admin,
    };
    let resp = peer
        .range_scan(keyway_node::kw::rpc::request(
            &route,
            cursor.clone(),
            None,
            10,
        ))
        .await
        .unwrap();
    match keyway_node::kw::rpc::read_reply(ks.id, resp) {
        keyway_node::kw::rpc::ScanReply::Stale(newer) => {
            assert_eq!(newer.record.id, children[0].id);
            assert!(newer.record.epoch > old.epoch);
        }
        other => panic!("a stale epoch must be refused, got {other:?}"),
    }

    // KW.AT carries the epoch for the single-key commands too: the parent's
    // epoch is refused with the child's record, the child's is served, and
    // KW.SCAN (which walks partitions itself) takes none.
    let mut owner = Conn::connect(&map.nodes[&old.owner].resp_addr).await;
    let at = |p: &keyway_map::PartitionRecord| [p.id.0.to_string(), p.epoch.0.to_string()];
    let [pid, epoch] = at(&old);
    let stale = owner
        .cmd(&["KW.AT", &pid, &epoch, "KW.GET", "log", &key(0)])
        .await;
    assert!(
        err_text(&stale).starts_with(&format!("KWMOVED {} ", children[0].id)),
        "{stale:?}"
    );
    let [pid, epoch] = at(&children[0]);
    let fresh = owner
        .cmd(&["KW.AT", &pid, &epoch, "KW.GET", "log", &key(0)])
        .await;
    assert_eq!(fresh, bulk(&value(0)));
    let scan_at = owner
        .cmd(&["KW.AT", &pid, &epoch, "KW.SCAN", "log", "", ""])
        .await;
    assert!(err_text(&scan_at).contains("takes no epoch"), "{scan_at:?}");

    // The scan goes on from its cursor: nothing skipped, nothing twice.
    let c_text = String::from_utf8(cursor.to_vec()).unwrap();
    got.extend(scan_pages(&mut conn, "log", &c_text, "", 250).await);
    assert_eq!(got, expected(0..n));
    // And the moved values are intact on their new owner.
    assert_eq!(
        client.kw_get("log", key(n - 1).as_bytes()).await.unwrap(),
        Some(Bytes::from(value(n - 1)))
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_waits_out_a_fence_and_follows_a_refusal_to_a_newer_partition() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = ClusterSpec::ephemeral(3, dir.path().to_path_buf());
    spec.node.lease_ttl_ms = 60_000;
    spec.node.kw_scan_reroute_timeout_ms = 1_000;
    spec.manager = None;
    let c = LocalCluster::start(spec).await.expect("cluster starts");
    let ks = keyway_manager::create_keyspace(&**c.meta(), "q", Routing::Range, None)
        .await
        .unwrap();
    let ids: Vec<NodeId> = c.node_ids().into_iter().flatten().collect();
    let parts = split(&c, ks.id, b"", &["key00100", "key00200"], &ids).await;
    let addrs: Vec<String> = c.resp_addrs().into_iter().flatten().collect();
    let seeds: Vec<&str> = addrs.iter().map(|s| s.as_str()).collect();
    let client = Client::connect(&seeds, ClientConfig::default())
        .await
        .unwrap();
    for i in 0..300 {
        client
            .kw_set("q", key(i).as_bytes(), value(i).as_bytes())
            .await
            .unwrap();
    }
    let mut conn = Conn::connect(&addrs[0]).await;

    // Node 2's partition in its cutover fence: the scan reads up to it, waits
    // kw_scan_reroute_timeout_ms, and answers what it has with its cursor
    // at the fenced partition's start; from there, with nothing read, an error.
    let node2 = c.node(2).unwrap().shared().routing.clone();
    node2.set_fenced(parts[2].id, true);
    let (cursor, page) = scan(&mut conn, &["q", "", ""]).await;
    assert_eq!(page, expected(0..100), "LIMIT 100 by default");
    let cursor = String::from_utf8(cursor.unwrap().to_vec()).unwrap();
    let (cursor, page) = scan(&mut conn, &["q", &cursor, "", "LIMIT", "1000"]).await;
    assert_eq!(page, expected(100..200));
    assert_eq!(cursor.as_deref(), Some(&b"key00200"[..]));
    let refused = conn.cmd(&["KW.SCAN", "q", "key00200", ""]).await;
    assert!(
        err_text(&refused).starts_with("CLUSTERDOWN KW.SCAN could not read"),
        "{refused:?}"
    );
    node2.set_fenced(parts[2].id, false);
    assert_eq!(
        scan_pages(&mut conn, "q", "key00200", "", 1000).await,
        expected(200..300)
    );

    // Node 2 alone learns of a split of its partition (installed straight
    // into its routing view): node 0 still asks for the old (partition,
    // epoch), is refused with the newer child, and follows it at once.
    let mut map = (*node2.map()).clone();
    let old = &parts[2];
    let first = map.next_partition_id.0;
    let child = |i: u64, start: &str, end: Option<&str>| PartitionRecord {
        id: PartitionId(first + i),
        start: Bytes::copy_from_slice(start.as_bytes()),
        end: end.map(|e| Bytes::copy_from_slice(e.as_bytes())),
        epoch: Epoch(old.epoch.0 + 1),
        ..old.clone()
    };
    let version = keyway_map::MapVersion(map.version.0 + 1);
    map.apply(
        version,
        &[
            MapChange::RemovePartition { id: old.id },
            MapChange::UpsertPartition(child(0, "key00200", Some("key00250"))),
            MapChange::UpsertPartition(child(1, "key00250", None)),
        ],
    )
    .unwrap();
    node2.install(map).unwrap();
    assert_eq!(
        scan_pages(&mut conn, "q", "", "", 1000).await,
        expected(0..300)
    );
    assert_eq!(
        scan_pages(&mut conn, "q", "key00150", "", 70).await,
        expected(150..300)
    );
    c.shutdown().await;
}

fn ctl(meta_port: u16, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_keyway"))
        .args(["ctl", "--meta", &format!("keyway://127.0.0.1:{meta_port}")])
        .args(args)
        .env("KEYWAY_LOG", "warn")
        .output()
        .expect("run keyway ctl")
}

fn ctl_ok(meta_port: u16, args: &[&str]) -> String {
    run(Command::new(env!("CARGO_BIN_EXE_keyway"))
        .args(["ctl", "--meta", &format!("keyway://127.0.0.1:{meta_port}")])
        .args(args)
        .env("KEYWAY_LOG", "warn"))
}

#[test]
fn ctl_keyspace_and_redis_cli_kw_commands() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = DevCluster::start(2, dir.path(), &[]);
    let meta = cluster.meta_port;

    let created = ctl_ok(
        meta,
        &["keyspace", "create", "events", "--routing", "range"],
    );
    assert!(
        created.contains("keyspace events created: id 1, range routing, 1 partition(s)"),
        "{created}"
    );
    let json: serde_json::Value = serde_json::from_str(&ctl_ok(
        meta,
        &[
            "keyspace",
            "create",
            "users",
            "--routing",
            "hash",
            "--partitions",
            "4",
            "--json",
        ],
    ))
    .unwrap();
    assert_eq!(
        (json["id"].as_u64(), json["partitions"].as_u64()),
        (Some(2), Some(4))
    );
    assert_eq!(
        json["nodes"].as_u64(),
        Some(2),
        "round-robin over both nodes"
    );
    for (args, why) in [
        (
            &["keyspace", "create", "events", "--routing", "hash"][..],
            "keyspace 'events' already exists",
        ),
        (
            &["keyspace", "create", "9lives", "--routing", "range"],
            "must start with a letter",
        ),
        (
            &[
                "keyspace",
                "create",
                "r2",
                "--routing",
                "range",
                "--partitions",
                "3",
            ],
            "starts as one partition",
        ),
    ] {
        let out = ctl(meta, args);
        assert!(!out.status.success(), "{args:?} must fail");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(why), "{args:?}: {stderr}");
    }
    let table = ctl_ok(meta, &["keyspace", "list"]);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 4, "{table}");
    assert!(
        lines[2].contains("events") && lines[2].contains("range"),
        "{table}"
    );
    let list: Vec<serde_json::Value> =
        serde_json::from_str(&ctl_ok(meta, &["keyspace", "list", "--json"])).unwrap();
    let names: Vec<&str> = list.iter().map(|k| k["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["default", "events", "users"]);

    // The range keyspace's one partition is on one of the two nodes; the
    // other answers KWMOVED naming it.
    let ports = cluster.ports();
    let (owner, other) = {
        let a = redis_cli(ports[0], &["KW.SET", "events", "a", "1"]);
        if a == "OK" {
            (ports[0], ports[1])
        } else {
            assert!(a.starts_with("KWMOVED "), "{a}");
            (ports[1], ports[0])
        }
    };
    assert_eq!(redis_cli(owner, &["KW.SET", "events", "a", "1"]), "OK");
    assert_eq!(redis_cli(owner, &["KW.SET", "events", "b", "2"]), "OK");
    assert_eq!(redis_cli(owner, &["KW.GET", "events", "a"]), "1");
    let moved = redis_cli(other, &["KW.GET", "events", "a"]);
    assert!(
        moved.starts_with("KWMOVED ") && moved.ends_with(&format!("127.0.0.1:{owner}")),
        "{moved}"
    );
    // KW.SCAN is answered by either node; redis-cli prints a nil cursor as
    // an empty line, then the keys and values.
    for port in [owner, other] {
        let out = redis_cli(port, &["KW.SCAN", "events", "", ""]);
        assert_eq!(
            out.lines().collect::<Vec<_>>(),
            ["", "a", "1", "b", "2"],
            "{out}"
        );
        let page = redis_cli(port, &["KW.SCAN", "events", "", "", "LIMIT", "1"]);
        // The cursor is the successor of the last key: "a" and a zero byte.
        assert_eq!(
            page.lines().collect::<Vec<_>>(),
            ["a\0", "a", "1"],
            "{page:?}"
        );
    }
    assert_eq!(redis_cli(owner, &["KW.DEL", "events", "a", "b"]), "2");
    assert_eq!(redis_cli(owner, &["KW.GET", "events", "a"]), "");
    assert_eq!(redis_cli(owner, &["DBSIZE"]), "0");
}
