//! Every Redis type through live moves, with real cluster clients: redis-py's
//! `RedisCluster` (`tests/py/types_workload.py`) and ioredis's
//! `Redis.Cluster` (`tests/js/types_workload.js`) each run a workload over
//! strings, hashes, sets, lists, sorted sets and MULTI/EXEC under one hash
//! tag, every thread owning its keys and holding a model of their exact
//! content, while 10 consecutive moves (random partitions, random targets)
//! complete. Afterwards: no error besides the redirects the clients followed,
//! no read that differed from the acknowledged content (stale), nothing lost
//! in the final read-back by a fresh client, every type exercised, and the
//! clients followed MOVED redirects.
//!
//! The partitions and targets come from a seeded RNG; the seed is printed and
//! `KEYWAY_TEST_SEED=N` replays it. `KEYWAY_TEST_LOG=info` turns the
//! cluster's logs (stderr) on. The two tests take a lock so they never run
//! at the same time (each is a 3-node cluster plus 4 client threads).

use crate::common;

use common::workload::{Workload, assert_report_clean, ctl_json, python, read_map};
use common::{DevCluster, Resp};
use keyway_resp::Frame;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use std::time::Instant;

const MOVES: usize = 10;
const THREADS: usize = 4;
/// Each enabled type must have seen at least this many acknowledged writes
/// and as many checked reads.
const MIN_OPS_PER_TYPE: u64 = 50;
/// Keys of each data type per thread, and MULTI/EXEC groups per thread
/// (`KEYS_PER_TYPE` in both scripts).
const KEYS_PER_TYPE: u64 = 24;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// One probe command per family: the node must serve every one (the test
/// runs every type; the scripts' `--types` leaves families out by hand).
const FAMILIES: &[(&str, &str)] = &[
    ("hash", "hset"),
    ("set", "sadd"),
    ("list", "lpush"),
    ("zset", "zadd"),
    ("multi", "multi"),
];

/// `string` and every family, each checked with `COMMAND INFO`.
fn served_types(port: u16) -> Vec<&'static str> {
    let mut conn = Resp::connect(port);
    let mut types = vec!["string"];
    for (family, probe) in FAMILIES {
        let reply = conn.cmd(&["COMMAND", "INFO", probe]);
        assert!(
            matches!(&reply, Frame::Array(items) if matches!(items.first(), Some(Frame::Array(_)))),
            "the node does not serve {probe} ({family}): {reply:?}"
        );
        types.push(family);
    }
    types
}

fn py_workload(port: u16, stop: &Path, report: &Path, types: &str) -> Command {
    let mut cmd = Command::new(python());
    cmd.arg(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/py/types_workload.py"
    ))
    .arg(port.to_string())
    .arg(stop)
    .arg(report)
    .arg(THREADS.to_string())
    .args(["--types", types]);
    cmd
}

fn js_workload(port: u16, stop: &Path, report: &Path, types: &str) -> Command {
    let mut cmd = Command::new("node");
    cmd.arg(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/js/types_workload.js"
    ))
    .arg(port.to_string())
    .arg(stop)
    .arg(report)
    .arg(THREADS.to_string())
    .args(["--types", types]);
    cmd
}

type Spawn = fn(u16, &Path, &Path, &str) -> Command;

fn ten_live_moves(client: &str, spawn: Spawn) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let seed: u64 = match std::env::var("KEYWAY_TEST_SEED") {
        Ok(s) => s.parse().expect("KEYWAY_TEST_SEED must be a number"),
        Err(_) => rand::random(),
    };
    println!("{client}: seed {seed} (KEYWAY_TEST_SEED={seed} replays the same moves)");
    let mut rng = StdRng::seed_from_u64(seed);
    let began = Instant::now();

    let dir = tempfile::tempdir().unwrap();
    let log = std::env::var("KEYWAY_TEST_LOG").unwrap_or_else(|_| "warn".into());
    let cluster = DevCluster::start(
        3,
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
    let types = served_types(cluster.ports()[0]);
    println!("{client}: types {types:?}");
    let stopfile = dir.path().join("stop");
    let report_path = dir.path().join("report.json");
    let mut workload = Workload::spawn(spawn(
        cluster.ports()[0],
        &stopfile,
        &report_path,
        &types.join(","),
    ));
    let writes_before = workload.writes();

    for n in 1..=MOVES {
        let (partitions, nodes) = read_map(&meta);
        let ids: Vec<u64> = partitions.keys().copied().collect();
        let partition = ids[rng.random_range(0..ids.len())];
        let owner = partitions[&partition];
        let targets: Vec<u64> = nodes.keys().copied().filter(|&id| id != owner).collect();
        let target = targets[rng.random_range(0..targets.len())];
        let to = &nodes[&target];
        let writes = workload.writes();
        let start = Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_keyway"))
            .args(["ctl", "--meta", &meta, "move", &partition.to_string()])
            .args(["--to", to, "--wait", "--timeout-secs", "60"])
            .env("KEYWAY_LOG", "warn")
            .output()
            .expect("run keyway ctl move");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains(" DONE"),
            "{client}: move {n}/{MOVES}: partition {partition} node {owner} -> node {target} \
             ({to}) failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        println!(
            "{client}: move {n:2}/{MOVES}: partition {partition:2} node {owner} -> node {target} \
             in {:4} ms ({} writes meanwhile)",
            start.elapsed().as_millis(),
            workload.writes().saturating_sub(writes),
        );
        let (partitions, _) = read_map(&meta);
        assert_eq!(
            partitions[&partition], target,
            "partition {partition} did not move"
        );
        workload.assert_running();
    }
    let writes_during_moves = workload.writes().saturating_sub(writes_before);
    let report = workload.finish(&stopfile, &report_path);

    assert_report_clean(&report);
    assert!(
        writes_during_moves >= 200,
        "only {writes_during_moves} writes acknowledged during the moves"
    );
    assert!(
        report["redirects"]["moved"].as_u64().unwrap_or(0) >= MOVES as u64,
        "{client} followed fewer MOVED redirects than there were moves: {}",
        report["redirects"]
    );
    let reported: Vec<&str> = report["types"]
        .as_array()
        .expect("report.types")
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(reported, types, "the workload ran other types than asked");
    for t in &types {
        let per = &report["per_type"][*t];
        let (writes, reads) = (per["writes"].as_u64(), per["reads"].as_u64());
        assert!(
            writes >= Some(MIN_OPS_PER_TYPE) && reads >= Some(MIN_OPS_PER_TYPE),
            "{client}: type {t} was hardly exercised: {per}"
        );
        assert_eq!(per["stale"].as_u64(), Some(0), "{client}: stale {t} reads");
    }
    let data_types = types.iter().filter(|t| **t != "multi").count() as u64;
    let groups = if types.contains(&"multi") {
        KEYS_PER_TYPE / 2
    } else {
        0
    };
    assert_eq!(
        report["verified"].as_u64(),
        Some(THREADS as u64 * (data_types * KEYS_PER_TYPE + groups)),
        "the final pass did not read every key back"
    );

    let migrations = ctl_json(&meta, &["migrations"]);
    let migrations = migrations.as_array().expect("migrations is an array");
    let pauses: Vec<Option<u64>> = migrations.iter().map(|m| m["pause_ms"].as_u64()).collect();
    assert!(
        migrations.len() == MOVES && migrations.iter().all(|m| m["state"] == "DONE"),
        "expected {MOVES} DONE migrations: {migrations:#?}"
    );
    println!(
        "{client}: cutover pauses (ms): {pauses:?}; total {:?}",
        began.elapsed()
    );
}

#[test]
fn ten_live_moves_under_a_redis_py_workload_of_every_type_lose_nothing() {
    ten_live_moves("redis-py", py_workload);
}

#[test]
fn ten_live_moves_under_an_ioredis_workload_of_every_type_lose_nothing() {
    ten_live_moves("ioredis", js_workload);
}
