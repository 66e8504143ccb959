//! `keyway proxy`, the routing tier, with clients that have no cluster
//! support at all:
//! - the real `redis-cli` (without `-c`) runs SET/GET/MSET/MGET/DEL/EXISTS/
//!   INCR over keys of every node, KW.SET/KW.GET/KW.SCAN on a range
//!   keyspace before and after its partition splits and moves, and gets
//!   clear errors for CLUSTER and SELECT 1;
//! - redis-py's plain `redis.Redis` clients write unique increasing values
//!   and read them back (plus MSET/MGET across slots) while partitions move
//!   and split again and again: no error, no redirect, no lost write, no
//!   stale read;
//! - two proxies side by side serve the same data, before and after a move;
//! - a blocking command (BLPOP) waits through the proxy past its request
//!   timeout, on a node connection of its own, while other clients' requests
//!   on the proxy's shared node connection go on.
//!
//! `keyway dev` runs with `--no-rebalance --no-auto-merge --no-auto-split`
//! so only the tests' moves and splits happen. Random choices come from a
//! seed printed at start (`KEYWAY_TEST_SEED=N` replays it).

use crate::common;

use common::workload::{Workload, assert_report_clean, assert_report_ran, ctl_json};
use common::{DevCluster, Proc, Resp, free_port_block, http_get, redis_cli, run};
use keyway_map::{DEFAULT_KEYSPACE, KeyspaceId, PartitionMap, key_hash_slot};
use keyway_resp::Frame;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const DEV_FLAGS: [&str; 5] = [
    "--migration-cleanup-grace-ms",
    "200",
    "--no-rebalance",
    "--no-auto-merge",
    "--no-auto-split",
];

/// A `keyway proxy` process and its ports.
struct ProxyProc {
    _proc: Proc,
    port: u16,
    admin: u16,
}

fn spawn_proxy(meta: &str) -> ProxyProc {
    spawn_proxy_with(meta, &[])
}

fn spawn_proxy_with(meta: &str, extra: &[&str]) -> ProxyProc {
    let base = free_port_block(2);
    let args: Vec<String> = [
        "proxy",
        "--meta",
        meta,
        "--listen",
        &format!("127.0.0.1:{base}"),
        "--admin-listen",
        &format!("127.0.0.1:{}", base + 1),
    ]
    .iter()
    .chain(extra)
    .map(|s| s.to_string())
    .collect();
    ProxyProc {
        _proc: Proc::spawn(&args, "serving"),
        port: base,
        admin: base + 1,
    }
}

fn status(proxy: &ProxyProc) -> Value {
    let body = http_get(proxy.admin, "/status").expect("proxy /status answers 200");
    serde_json::from_str(&body).expect("/status is JSON")
}

/// The store's map, as `keyway ctl map --json` prints it.
fn store_map(meta: &str) -> PartitionMap {
    let mut map: PartitionMap =
        serde_json::from_value(ctl_json(meta, &["map"])).expect("map JSON is a PartitionMap");
    map.reindex();
    map
}

/// Waits until the proxy routes by the store's current map version.
fn wait_proxy_current(proxy: &ProxyProc, meta: &str) {
    let want = store_map(meta).version.0;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = status(proxy)["map_version"].as_u64().unwrap_or(0);
        if got >= want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the proxy's map stayed at version {got}, the store is at {want}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Feeds `commands` (one per line) to one `redis-cli -p PORT` and returns
/// its output lines.
fn redis_cli_lines(port: u16, commands: &[String]) -> Vec<String> {
    let mut child = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn redis-cli");
    {
        let mut stdin = child.stdin.take().expect("piped stdin");
        stdin
            .write_all(commands.join("\n").as_bytes())
            .expect("write commands");
        stdin.write_all(b"\n").expect("write commands");
    }
    let out = child.wait_with_output().expect("redis-cli output");
    assert!(
        out.status.success(),
        "redis-cli failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

fn ctl(meta: &str, args: &[&str]) -> String {
    run(Command::new(env!("CARGO_BIN_EXE_keyway"))
        .args(["ctl", "--meta", meta])
        .args(args)
        .env("KEYWAY_LOG", "warn"))
}

/// `keyway ctl move P --to ADDR --wait`, asserting it finished.
fn move_partition(meta: &str, partition: u64, to: &str) -> String {
    let out = ctl(
        meta,
        &[
            "move",
            &partition.to_string(),
            "--to",
            to,
            "--wait",
            "--timeout-secs",
            "60",
        ],
    );
    assert!(out.contains(" DONE"), "move of {partition} to {to}: {out}");
    out.trim().to_string()
}

/// Some node other than `owner`, by RESP address.
fn other_node(map: &PartitionMap, owner: keyway_map::NodeId, rng: &mut StdRng) -> String {
    let others: Vec<&str> = map
        .nodes
        .values()
        .filter(|n| n.id != owner)
        .map(|n| n.resp_addr.as_str())
        .collect();
    others[rng.random_range(0..others.len())].to_string()
}

fn seeded() -> StdRng {
    let seed: u64 = match std::env::var("KEYWAY_TEST_SEED") {
        Ok(s) => s.parse().expect("KEYWAY_TEST_SEED must be a number"),
        Err(_) => rand::random(),
    };
    println!("seed {seed} (KEYWAY_TEST_SEED={seed} replays it)");
    StdRng::seed_from_u64(seed)
}

#[test]
fn redis_cli_without_cluster_support_reaches_every_node_and_range_keyspaces() {
    let mut rng = seeded();
    let dir = tempfile::tempdir().unwrap();
    let cluster = DevCluster::start(3, &dir.path().join("data"), &DEV_FLAGS);
    let meta = format!("keyway://127.0.0.1:{}", cluster.base());
    let proxy = spawn_proxy(&meta);
    let port = proxy.port;

    // SET and GET 300 keys spread over every node, one redis-cli session each.
    let n = 300;
    let sets: Vec<String> = (0..n).map(|i| format!("SET key:{i} value-{i}")).collect();
    assert_eq!(redis_cli_lines(port, &sets), vec!["OK"; n]);
    let gets: Vec<String> = (0..n).map(|i| format!("GET key:{i}")).collect();
    let want: Vec<String> = (0..n).map(|i| format!("value-{i}")).collect();
    assert_eq!(redis_cli_lines(port, &gets), want);
    for node in cluster.ports() {
        let keys: u64 = redis_cli(node, &["dbsize"]).parse().unwrap();
        assert!(keys > 0, "node {node} got none of the {n} keys");
    }

    // MSET across slots, MGET in the client's order (with a missing key).
    let mut mset = vec!["mset".to_string()];
    for i in 0..40 {
        mset.push(format!("m:{i}"));
        mset.push(format!("mv-{i}"));
    }
    let mset: Vec<&str> = mset.iter().map(String::as_str).collect();
    assert_eq!(redis_cli(port, &mset), "OK");
    // (redis-cli prints a missing value as an empty line; keep it inside.)
    let mut mget = vec!["mget".to_string()];
    mget.extend((0..40).rev().map(|i| format!("m:{i}")));
    mget.insert(5, "m:missing".into());
    let mget: Vec<&str> = mget.iter().map(String::as_str).collect();
    let mut expected: Vec<String> = (0..40).rev().map(|i| format!("mv-{i}")).collect();
    expected.insert(4, String::new());
    assert_eq!(redis_cli(port, &mget), expected.join("\n"));
    let slots: std::collections::BTreeSet<u16> = (0..40)
        .map(|i| key_hash_slot(format!("m:{i}").as_bytes()))
        .collect();
    assert!(slots.len() > 30, "the MSET keys should span many slots");

    // EXISTS counts repeats; DEL across slots counts what it deleted.
    assert_eq!(
        redis_cli(port, &["exists", "m:1", "m:2", "m:1", "nope", "key:7"]),
        "4"
    );
    assert_eq!(
        redis_cli(port, &["del", "m:1", "m:2", "m:3", "nope", "key:7"]),
        "4"
    );
    assert_eq!(redis_cli(port, &["exists", "m:1", "m:2", "key:7"]), "0");
    assert_eq!(redis_cli(port, &["get", "key:7"]), "");

    // INCR on keys of different slots, interleaved in one session.
    let incrs: Vec<String> = (0..60).map(|i| format!("INCR counter:{}", i % 6)).collect();
    let counts: Vec<String> = (0..60).map(|i| (i / 6 + 1).to_string()).collect();
    assert_eq!(redis_cli_lines(port, &incrs), counts);
    // A cross-slot MSETNX cannot be atomic: refused, as a cluster would.
    let msetnx = redis_cli(port, &["msetnx", "x:1", "1", "x:2", "2"]);
    assert!(msetnx.starts_with("CROSSSLOT"), "{msetnx}");

    // Plain mode: cluster commands and other databases are refused clearly.
    for cmd in [
        &["cluster", "info"][..],
        &["cluster", "slots"],
        &["readonly"],
    ] {
        let out = redis_cli(port, cmd);
        assert!(
            out.contains("cluster support disabled") && out.contains("keyway proxy"),
            "{cmd:?}: {out}"
        );
    }
    let select = redis_cli(port, &["select", "1"]);
    assert!(select.contains("DB index is out of range"), "{select}");
    assert_eq!(redis_cli(port, &["select", "0"]), "OK");
    assert_eq!(redis_cli(port, &["ping"]), "PONG");
    let info = redis_cli(port, &["info"]);
    assert!(info.contains("redis_mode:standalone"), "{info}");
    assert!(info.contains("keyway_role:proxy"), "{info}");
    assert!(info.contains("# Proxy"), "{info}");

    // A range keyspace: KW.SET / KW.GET / KW.SCAN through the proxy.
    ctl(
        &meta,
        &["keyspace", "create", "events", "--routing", "range"],
    );
    wait_proxy_current(&proxy, &meta);
    let kw_sets: Vec<String> = (0..40)
        .map(|i| format!("KW.SET events e:{i:03} v{i}"))
        .collect();
    assert_eq!(redis_cli_lines(port, &kw_sets), vec!["OK"; 40]);
    assert_eq!(redis_cli(port, &["kw.get", "events", "e:017"]), "v17");
    let scan_all = |from: &str| {
        let out = redis_cli(port, &["kw.scan", "events", from, "", "LIMIT", "1000"]);
        let lines: Vec<String> = out.lines().map(str::to_string).collect();
        assert_eq!(lines[0], "", "the whole range fits one page: no cursor");
        lines[1..].to_vec()
    };
    let everything: Vec<String> = (0..40)
        .flat_map(|i| [format!("e:{i:03}"), format!("v{i}")])
        .collect();
    assert_eq!(scan_all(""), everything);

    // Split the range partition and move its right half: the proxy keeps
    // serving every key, and KW.SCAN still walks all of them in order.
    let map = store_map(&meta);
    let events = map.keyspace_by_name("events").expect("events keyspace").id;
    assert_ne!(events, DEFAULT_KEYSPACE);
    let whole = partitions_of(&map, events);
    assert_eq!(whole.len(), 1);
    ctl(&meta, &["split", &whole[0].to_string(), "--at", "e:020"]);
    let map = store_map(&meta);
    let halves = partitions_of(&map, events);
    assert_eq!(halves.len(), 2, "split into two");
    let right = map.locate(events, b"e:030").expect("right half").clone();
    let to = other_node(&map, right.owner, &mut rng);
    println!("{}", move_partition(&meta, right.id.0, &to));
    assert_eq!(redis_cli(port, &["kw.get", "events", "e:030"]), "v30");
    assert_eq!(redis_cli(port, &["kw.set", "events", "e:031", "new"]), "OK");
    assert_eq!(redis_cli(port, &["kw.get", "events", "e:031"]), "new");
    let mut after = everything.clone();
    after[31 * 2 + 1] = "new".into();
    assert_eq!(scan_all(""), after);
    assert_eq!(scan_all("e:015"), after[30..].to_vec());
    assert_eq!(redis_cli(port, &["kw.del", "events", "e:031"]), "1");
    assert_eq!(redis_cli(port, &["kw.get", "events", "e:031"]), "");

    // The keys of keyspace 0 are all still there.
    let gets: Vec<String> = (8..n).map(|i| format!("GET key:{i}")).collect();
    assert_eq!(redis_cli_lines(port, &gets), want[8..].to_vec());
    let s = status(&proxy);
    assert_eq!(s["ready"], Value::Bool(true), "{s}");
    assert_eq!(s["unknown_outcomes"].as_u64(), Some(0), "{s}");
    println!("proxy status: {s}");
}

fn partitions_of(map: &PartitionMap, ks: KeyspaceId) -> Vec<u64> {
    map.keyspace_partitions(ks).map(|p| p.id.0).collect()
}

const ROUNDS: usize = 6;
const THREADS: usize = 4;

#[test]
fn redis_py_plain_clients_see_no_error_while_partitions_move_and_split() {
    let mut rng = seeded();
    let began = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let cluster = DevCluster::start(3, &dir.path().join("data"), &DEV_FLAGS);
    let meta = format!("keyway://127.0.0.1:{}", cluster.base());
    let proxy = spawn_proxy(&meta);
    let stopfile = dir.path().join("stop");
    let report_path = dir.path().join("report.json");
    let mut workload =
        Workload::start_with(proxy.port, &stopfile, &report_path, THREADS, &["--plain"]);
    let writes_before = workload.writes();

    for round in 1..=ROUNDS {
        // A move of a random keyspace-0 partition to another node.
        let map = store_map(&meta);
        let parts: Vec<_> = map.keyspace_partitions(DEFAULT_KEYSPACE).cloned().collect();
        let p = &parts[rng.random_range(0..parts.len())];
        let to = other_node(&map, p.owner, &mut rng);
        let writes = workload.writes();
        let started = Instant::now();
        let moved = move_partition(&meta, p.id.0, &to);
        println!(
            "round {round}/{ROUNDS}: move of partition {} in {} ms ({} writes meanwhile): {moved}",
            p.id,
            started.elapsed().as_millis(),
            workload.writes().saturating_sub(writes)
        );
        workload.assert_running();

        // A split of a random keyspace-0 partition wide enough to split.
        let map = store_map(&meta);
        let wide: Vec<_> = map
            .keyspace_partitions(DEFAULT_KEYSPACE)
            .filter(|p| {
                let (first, last) = p.slot_span();
                last > first
            })
            .cloned()
            .collect();
        let p = &wide[rng.random_range(0..wide.len())];
        let split = ctl(&meta, &["split", &p.id.to_string()]);
        println!(
            "round {round}/{ROUNDS}: split of partition {}: {}",
            p.id,
            split.trim()
        );
        assert_eq!(
            store_map(&meta)
                .keyspace_partitions(DEFAULT_KEYSPACE)
                .count(),
            map.keyspace_partitions(DEFAULT_KEYSPACE).count() + 1,
            "the split added a partition"
        );
        workload.assert_running();
    }
    let writes_during = workload.writes().saturating_sub(writes_before);
    wait_proxy_current(&proxy, &meta);

    let report = workload.finish(&stopfile, &report_path);
    assert_eq!(
        report["plain"],
        Value::Bool(true),
        "plain redis.Redis clients"
    );
    assert_report_ran(&report, THREADS);
    assert!(
        writes_during >= 200,
        "only {writes_during} writes acknowledged during the moves and splits"
    );
    // No redirect ever reached a client: the proxy followed them all.
    assert_eq!(report["redirects"]["moved"].as_u64(), Some(0), "{report}");
    assert_eq!(report["redirects"]["ask"].as_u64(), Some(0), "{report}");
    assert_report_clean(&report);
    let s = status(&proxy);
    println!("proxy status: {s}");
    assert_eq!(s["unknown_outcomes"].as_u64(), Some(0), "{s}");
    assert_eq!(s["timeouts"].as_u64(), Some(0), "{s}");
    println!("total {:?}", began.elapsed());
}

fn ok(frame: Frame) {
    assert_eq!(frame, Frame::Simple("OK".into()));
}

#[test]
fn two_proxies_side_by_side_serve_the_same_data() {
    let mut rng = seeded();
    let dir = tempfile::tempdir().unwrap();
    let cluster = DevCluster::start(3, &dir.path().join("data"), &DEV_FLAGS);
    let meta = format!("keyway://127.0.0.1:{}", cluster.base());
    let (pa, pb) = (spawn_proxy(&meta), spawn_proxy(&meta));
    let (mut a, mut b) = (Resp::connect(pa.port), Resp::connect(pb.port));

    for i in 0..200 {
        ok(a.cmd(&["SET", &format!("k{i}"), &format!("a{i}")]));
    }
    for i in 0..200 {
        assert_eq!(
            b.cmd(&["GET", &format!("k{i}")]),
            Frame::bulk(format!("a{i}"))
        );
    }
    // One counter, incremented through both: every increment counts once.
    for i in 0..50 {
        let via = if i % 2 == 0 { &mut a } else { &mut b };
        assert_eq!(via.cmd(&["INCR", "counter"]), Frame::Integer(i + 1));
    }

    // Move the counter's partition; both proxies follow without telling.
    let map = store_map(&meta);
    let p = map
        .locate_slot(DEFAULT_KEYSPACE, key_hash_slot(b"counter"))
        .expect("counter's partition")
        .clone();
    let to = other_node(&map, p.owner, &mut rng);
    println!("{}", move_partition(&meta, p.id.0, &to));
    for i in 50..100 {
        let via = if i % 2 == 0 { &mut b } else { &mut a };
        assert_eq!(via.cmd(&["INCR", "counter"]), Frame::Integer(i + 1));
    }
    for i in 0..200 {
        ok(b.cmd(&["SET", &format!("k{i}"), &format!("b{i}")]));
    }
    let mget: Vec<String> = (0..200).map(|i| format!("k{i}")).collect();
    let mut args = vec!["MGET"];
    args.extend(mget.iter().map(String::as_str));
    let want = Frame::Array((0..200).map(|i| Frame::bulk(format!("b{i}"))).collect());
    assert_eq!(a.cmd(&args), want);
    assert_eq!(b.cmd(&args), want);

    // Both route by the store's map now, and neither lost an outcome.
    for proxy in [&pa, &pb] {
        wait_proxy_current(proxy, &meta);
        let s = status(proxy);
        assert_eq!(s["unknown_outcomes"].as_u64(), Some(0), "{s}");
        println!("proxy status: {s}");
    }
}

#[test]
fn blocking_commands_wait_past_the_request_timeout_without_holding_up_others() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = DevCluster::start(1, &dir.path().join("data"), &DEV_FLAGS);
    let meta = format!("keyway://127.0.0.1:{}", cluster.base());
    // One shared connection per node: a BLPOP on it would hold up the rest.
    let proxy = spawn_proxy_with(
        &meta,
        &[
            "--request-timeout-ms",
            "300",
            "--connect-timeout-ms",
            "200",
            "--node-connections",
            "1",
        ],
    );
    let mut a = Resp::connect(proxy.port);
    let mut b = Resp::connect(proxy.port);
    let blpop = Frame::Array(
        ["BLPOP", "{p}list", "0"]
            .iter()
            .map(|s| Frame::bulk(s.to_string()))
            .collect(),
    );
    let mut out = bytes::BytesMut::new();
    keyway_resp::encode(&blpop, keyway_resp::Protocol::Resp2, &mut out);
    a.send_raw(&out).unwrap();
    let began = Instant::now();
    // Others go on meanwhile, through the same node connection.
    for i in 0..50 {
        ok(b.cmd(&["SET", &format!("{{p}}k{i}"), "v"]));
        assert_eq!(b.cmd(&["GET", &format!("{{p}}k{i}")]), Frame::bulk("v"));
    }
    // What is tested is time itself: the BLPOP outlives the 300 ms request
    // timeout.
    std::thread::sleep(Duration::from_millis(700).saturating_sub(began.elapsed()));
    assert_eq!(b.cmd(&["RPUSH", "{p}list", "x"]), Frame::Integer(1));
    assert_eq!(
        a.read_reply().unwrap(),
        Frame::Array(vec![Frame::bulk("{p}list"), Frame::bulk("x")])
    );
    // A timeout longer than the request timeout: nil at the timeout.
    let began = Instant::now();
    assert_eq!(a.cmd(&["BLPOP", "{p}none", "0.8"]), Frame::NullArray);
    assert!(began.elapsed() >= Duration::from_millis(800));
    // RESP2's null array where Redis sends one (the node connections speak
    // RESP3, which has one null), plain nil where Redis sends that.
    assert_eq!(a.cmd(&["LPOP", "{p}none", "2"]), Frame::NullArray);
    assert_eq!(a.cmd(&["LMPOP", "1", "{p}none", "LEFT"]), Frame::NullArray);
    assert_eq!(a.cmd(&["LPOP", "{p}none"]), Frame::Null);
    assert_eq!(
        a.cmd(&["BLMPOP", "0.05", "1", "{p}none", "LEFT"]),
        Frame::NullArray
    );
    // Commands whose keys follow a numkeys argument are routed by them.
    assert_eq!(a.cmd(&["ZMPOP", "1", "{p}none", "MIN"]), Frame::NullArray);
    assert_eq!(
        a.cmd(&["SINTERCARD", "2", "{p}s1", "{p}s2"]),
        Frame::Integer(0)
    );
    assert!(matches!(
        a.cmd(&["LMPOP", "2", "{p}x", "{q}y", "LEFT"]),
        Frame::Error(e) if e.starts_with("CROSSSLOT")
    ));
    assert!(status(&proxy)["dedicated_calls"].as_u64().unwrap() >= 2);
    assert_eq!(status(&proxy)["timeouts"].as_u64(), Some(0));
}
