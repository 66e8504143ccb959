//! Live migrations under a real client workload: while redis-py's
//! RedisCluster clients write unique, increasing values and read them back
//! continuously, 20 consecutive moves (random partitions, random targets)
//! complete; afterwards every acknowledged write holds its last acknowledged
//! value, no read returned an older value than one already acknowledged, and
//! the clients saw no error besides the redirects they followed.
//!
//! The nodes truncate their change logs every 50 ms meanwhile, so each
//! migration completes on what its log hold keeps (`log_gc.rs`).
//!
//! The partitions and targets come from a seeded RNG; the seed is printed and
//! `KEYWAY_TEST_SEED=N` replays it. `KEYWAY_TEST_LOG=info` turns the cluster's
//! logs (stderr) on. For a soak, `KEYWAY_TEST_MOVES=N` makes it N moves and
//! `KEYWAY_TEST_TRUNCATE_MS=T` truncates every T ms.

use crate::common;

use common::DevCluster;
use common::workload::{Workload, assert_report_clean, assert_report_ran, ctl_json, read_map};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use std::collections::BTreeMap;
use std::process::Command;
use std::time::Instant;

const MOVES: usize = 20;
const THREADS: usize = 4;

/// `KEYWAY_TEST_MOVES=N` runs N moves instead of [`MOVES`] (a longer soak).
fn moves() -> usize {
    std::env::var("KEYWAY_TEST_MOVES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(MOVES)
}

#[test]
fn twenty_live_moves_under_a_redis_py_workload_lose_nothing() {
    let seed: u64 = match std::env::var("KEYWAY_TEST_SEED") {
        Ok(s) => s.parse().expect("KEYWAY_TEST_SEED must be a number"),
        Err(_) => rand::random(),
    };
    println!("seed {seed} (KEYWAY_TEST_SEED={seed} replays the same moves)");
    let mut rng = StdRng::seed_from_u64(seed);
    let began = Instant::now();

    let dir = tempfile::tempdir().unwrap();
    let log = std::env::var("KEYWAY_TEST_LOG").unwrap_or_else(|_| "warn".into());
    // `KEYWAY_TEST_TRUNCATE_MS` changes how often the logs are truncated.
    let truncate_ms = std::env::var("KEYWAY_TEST_TRUNCATE_MS").unwrap_or_else(|_| "50".into());
    let cluster = DevCluster::start(
        3,
        &dir.path().join("data"),
        &[
            "--migration-cleanup-grace-ms",
            "200",
            "--no-rebalance",
            "--log-truncate-interval-ms",
            &truncate_ms,
            "--log",
            &log,
        ],
    );
    let meta = format!("keyway://127.0.0.1:{}", cluster.base());
    let stopfile = dir.path().join("stop");
    let report_path = dir.path().join("report.json");
    let mut workload = Workload::start(cluster.ports()[0], &stopfile, &report_path, THREADS);
    let writes_before = workload.writes();

    // Where each moved partition must end up.
    let mut expected_owner = BTreeMap::new();
    let moves = moves();
    for n in 1..=moves {
        let (partitions, nodes) = read_map(&meta);
        let ids: Vec<u64> = partitions.keys().copied().collect();
        let partition = ids[rng.random_range(0..ids.len())];
        let owner = partitions[&partition];
        let targets: Vec<u64> = nodes.keys().copied().filter(|&id| id != owner).collect();
        assert!(
            !targets.is_empty(),
            "no node to move partition {partition} to"
        );
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
            "move {n}/{moves}: partition {partition} node {owner} -> node {target} ({to}) \
             failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        println!(
            "move {n:2}/{moves}: partition {partition:2} node {owner} -> node {target} in {:4} ms \
             ({} writes meanwhile): {}",
            start.elapsed().as_millis(),
            workload.writes().saturating_sub(writes),
            stdout.trim()
        );
        expected_owner.insert(partition, target);
        workload.assert_running();
    }
    let writes_during_moves = workload.writes().saturating_sub(writes_before);
    println!("{moves} moves done after {:?}", began.elapsed());

    let (partitions, _) = read_map(&meta);
    for (partition, target) in &expected_owner {
        assert_eq!(
            partitions[partition], *target,
            "partition {partition} is not on the node it was last moved to"
        );
    }

    let report = workload.finish(&stopfile, &report_path);

    let count = |field: &str| {
        report[field]
            .as_u64()
            .unwrap_or_else(|| panic!("report has no count {field:?}"))
    };
    // The workload really ran, and ran through the moves.
    assert_report_ran(&report, THREADS);
    assert!(
        writes_during_moves >= 200,
        "only {writes_during_moves} writes acknowledged during the moves"
    );
    assert!(
        report["redirects"]["moved"].as_u64().unwrap_or(0) >= moves as u64,
        "the clients followed fewer MOVED redirects than there were moves: {}",
        report["redirects"]
    );
    assert!(
        count("keys_written") >= THREADS as u64 * 100,
        "too few distinct keys written"
    );
    // And nothing went wrong.
    assert_report_clean(&report);

    let migrations = ctl_json(&meta, &["migrations"]);
    let migrations = migrations.as_array().expect("migrations is an array");
    let done: Vec<&Value> = migrations
        .iter()
        .filter(|m| m["state"].as_str() == Some("DONE"))
        .collect();
    let pauses: Vec<u64> = done
        .iter()
        .map(|m| m["pause_ms"].as_u64().expect("pause_ms"))
        .collect();
    println!("cutover pauses (ms): {pauses:?}");
    assert_eq!(
        done.len(),
        moves,
        "expected {moves} DONE migrations: {migrations:#?}"
    );
    assert_eq!(
        migrations.len(),
        moves,
        "unexpected extra migrations: {migrations:#?}"
    );
    // The logs were truncated while the moves ran.
    for i in 0..cluster.nodes as u16 {
        let status = common::http_get(cluster.admin_port + i, "/status").expect("/status");
        let status: Value = serde_json::from_str(&status).unwrap();
        let first = status["change_log"]["first_seq"].as_u64().unwrap();
        assert!(
            first > 1,
            "node {i}'s change log was never truncated: {status}"
        );
    }
    println!("total {:?}", began.elapsed());
}
