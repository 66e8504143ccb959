//! Live migrations under a real client workload: while redis-py's
//! RedisCluster clients write unique, increasing values and read them back
//! continuously, 20 consecutive moves (random partitions, random targets)
//! complete; afterwards every acknowledged write holds its last acknowledged
//! value, no read returned an older value than one already acknowledged, and
//! the clients saw no error besides the redirects they followed.
//!
//! The partitions and targets come from a seeded RNG; the seed is printed and
//! `KEYWAY_TEST_SEED=N` replays it. `KEYWAY_TEST_LOG=info` turns the cluster's
//! logs (stderr) on.

mod common;

use common::{DevCluster, run};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MOVES: usize = 20;
const THREADS: usize = 4;
/// Keys per workload thread: 200 plain ones and 16 hash-tagged pairs.
const KEYS_PER_THREAD: u64 = 200 + 2 * 16;

fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".into())
}

/// The workload process, killed if the test fails before it exits.
struct Workload {
    child: Child,
    /// Writes acknowledged so far, from its `progress` lines.
    writes: Arc<AtomicU64>,
    output: Arc<Mutex<Vec<String>>>,
}

impl Workload {
    fn start(port: u16, stopfile: &Path, report: &Path) -> Workload {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/migrate_workload.py");
        let mut child = Command::new(python())
            .arg(script)
            .arg(port.to_string())
            .arg(stopfile)
            .arg(report)
            .arg(THREADS.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the redis-py workload");
        let writes = Arc::new(AtomicU64::new(0));
        let output = Arc::new(Mutex::new(Vec::new()));
        let (started_tx, started_rx) = mpsc::channel();
        let stdout = child.stdout.take().expect("piped stdout");
        {
            let (writes, output) = (writes.clone(), output.clone());
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if line == "started" {
                        let _ = started_tx.send(());
                    } else if let Some(rest) = line.strip_prefix("progress writes=") {
                        let n = rest.split_whitespace().next().unwrap_or("0");
                        writes.store(n.parse().unwrap_or(0), Ordering::Relaxed);
                    } else {
                        output.lock().unwrap().push(line);
                    }
                }
            });
        }
        let mut workload = Workload {
            child,
            writes,
            output,
        };
        if started_rx.recv_timeout(Duration::from_secs(60)).is_err() {
            let status = workload.child.try_wait().expect("poll workload");
            panic!(
                "the workload did not start within 60 s (exit status {status:?}): {:?}",
                workload.output.lock().unwrap()
            );
        }
        workload
    }

    fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    fn assert_running(&mut self) {
        if let Some(status) = self.child.try_wait().expect("poll workload") {
            panic!(
                "the workload exited early ({status}): {:?}",
                self.output.lock().unwrap()
            );
        }
    }

    /// Waits for the workload to exit on its own (after the stop file appeared).
    fn wait(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("poll workload") {
                assert!(
                    status.success(),
                    "the workload failed ({status}): {:?}",
                    self.output.lock().unwrap()
                );
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the workload did not finish within {timeout:?} of the stop file"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `keyway ctl --meta META ARGS... --json`, parsed.
fn ctl_json(meta: &str, args: &[&str]) -> Value {
    let out = run(Command::new(env!("CARGO_BIN_EXE_keyway"))
        .args(["ctl", "--meta", meta, "--json"])
        .args(args)
        .env("KEYWAY_LOG", "warn"));
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("ctl {args:?} --json: {e}\n{out}"))
}

/// The map: partition id -> owner node id, and node id -> RESP address.
fn read_map(meta: &str) -> (BTreeMap<u64, u64>, BTreeMap<u64, String>) {
    let map = ctl_json(meta, &["map"]);
    let partitions = map["partitions"]
        .as_object()
        .expect("map.partitions")
        .values()
        .map(|p| {
            (
                p["id"].as_u64().expect("partition id"),
                p["owner"].as_u64().expect("partition owner"),
            )
        })
        .collect();
    let nodes = map["nodes"]
        .as_object()
        .expect("map.nodes")
        .values()
        .map(|n| {
            (
                n["id"].as_u64().expect("node id"),
                n["resp_addr"].as_str().expect("resp_addr").to_string(),
            )
        })
        .collect();
    (partitions, nodes)
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
    let cluster = DevCluster::start(
        3,
        &dir.path().join("data"),
        &["--migration-cleanup-grace-ms", "200", "--log", &log],
    );
    let meta = format!("keyway://127.0.0.1:{}", cluster.base());
    let stopfile = dir.path().join("stop");
    let report_path = dir.path().join("report.json");
    let mut workload = Workload::start(cluster.ports()[0], &stopfile, &report_path);
    let writes_before = workload.writes();

    // Where each moved partition must end up.
    let mut expected_owner = BTreeMap::new();
    for n in 1..=MOVES {
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
            "move {n}/{MOVES}: partition {partition} node {owner} -> node {target} ({to}) \
             failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        println!(
            "move {n:2}/{MOVES}: partition {partition:2} node {owner} -> node {target} in {:4} ms \
             ({} writes meanwhile): {}",
            start.elapsed().as_millis(),
            workload.writes().saturating_sub(writes),
            stdout.trim()
        );
        expected_owner.insert(partition, target);
        workload.assert_running();
    }
    let writes_during_moves = workload.writes().saturating_sub(writes_before);
    println!("{MOVES} moves done after {:?}", began.elapsed());

    let (partitions, _) = read_map(&meta);
    for (partition, target) in &expected_owner {
        assert_eq!(
            partitions[partition], *target,
            "partition {partition} is not on the node it was last moved to"
        );
    }

    std::fs::write(&stopfile, b"stop").unwrap();
    workload.wait(Duration::from_secs(120));
    for line in workload.output.lock().unwrap().iter() {
        println!("{line}");
    }
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(&report_path).expect("workload report"))
            .expect("report is JSON");
    println!("{}", serde_json::to_string_pretty(&report).unwrap());

    let count = |field: &str| {
        report[field]
            .as_u64()
            .unwrap_or_else(|| panic!("report has no count {field:?}"))
    };
    // The workload really ran, and ran through the moves.
    assert!(
        report["started"].as_bool() == Some(true),
        "workload never started"
    );
    assert!(
        count("writes") >= 1000,
        "too few writes: {}",
        count("writes")
    );
    assert!(count("reads") >= 1000, "too few reads: {}", count("reads"));
    assert!(count("multi_key_ops") >= 100, "too few multi-key ops");
    assert!(
        writes_during_moves >= 200,
        "only {writes_during_moves} writes acknowledged during the moves"
    );
    assert!(
        report["redirects"]["moved"].as_u64().unwrap_or(0) >= MOVES as u64,
        "the clients followed fewer MOVED redirects than there were moves: {}",
        report["redirects"]
    );
    assert_eq!(
        count("verified"),
        THREADS as u64 * KEYS_PER_THREAD,
        "the final pass did not read every key back"
    );
    assert!(
        count("keys_written") >= THREADS as u64 * 100,
        "too few distinct keys written"
    );
    // And nothing went wrong.
    assert_eq!(
        count("errors"),
        0,
        "the clients saw errors: {}",
        report["error_samples"]
    );
    assert_eq!(
        count("stale_reads"),
        0,
        "stale reads: {}",
        report["stale_samples"]
    );
    assert_eq!(
        count("phantom_reads"),
        0,
        "phantom reads: {}",
        report["phantom_samples"]
    );
    assert_eq!(count("lost"), 0, "lost writes: {}", report["lost_samples"]);
    assert_eq!(
        report["redirects"]["tryagain"].as_u64(),
        Some(0),
        "the clients were told TRYAGAIN"
    );
    assert_eq!(
        report["hung_threads"].as_array().map(Vec::len),
        Some(0),
        "workload threads hung"
    );

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
        MOVES,
        "expected {MOVES} DONE migrations: {migrations:#?}"
    );
    assert_eq!(
        migrations.len(),
        MOVES,
        "unexpected extra migrations: {migrations:#?}"
    );
    println!("total {:?}", began.elapsed());
}
