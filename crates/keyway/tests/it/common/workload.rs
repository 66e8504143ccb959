//! The redis-py workload (`tests/py/migrate_workload.py`) as a child
//! process, and the `keyway ctl --json` readers the workload tests share.

use super::run;
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".into())
}

/// The workload process, killed if the test fails before it exits.
pub struct Workload {
    pub child: Child,
    /// Writes acknowledged so far, from its `progress` lines.
    writes: Arc<AtomicU64>,
    pub output: Arc<Mutex<Vec<String>>>,
}

impl Workload {
    pub fn start(port: u16, stopfile: &Path, report: &Path, threads: usize) -> Workload {
        Self::start_with(port, stopfile, report, threads, &[])
    }

    /// [`Workload::start`] with extra script flags (e.g. `--plain`: plain
    /// `redis.Redis` clients through a `keyway proxy`).
    pub fn start_with(
        port: u16,
        stopfile: &Path,
        report: &Path,
        threads: usize,
        flags: &[&str],
    ) -> Workload {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/migrate_workload.py");
        let mut cmd = Command::new(python());
        cmd.arg(script)
            .arg(port.to_string())
            .arg(stopfile)
            .arg(report)
            .arg(threads.to_string())
            .args(flags);
        Self::spawn(cmd)
    }

    /// Any workload script speaking the same protocol (`started` and
    /// `progress writes=N ...` lines on stdout, STOPFILE, REPORT_JSON):
    /// spawns `cmd` and waits for `started`.
    pub fn spawn(mut cmd: Command) -> Workload {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn the workload {cmd:?}: {e}"));
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

    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    pub fn assert_running(&mut self) {
        if let Some(status) = self.child.try_wait().expect("poll workload") {
            panic!(
                "the workload exited early ({status}): {:?}",
                self.output.lock().unwrap()
            );
        }
    }

    /// Creates the stop file, waits for the workload to finish, prints its
    /// output, and returns its report (printed too).
    pub fn finish(&mut self, stopfile: &Path, report_path: &Path) -> Value {
        std::fs::write(stopfile, b"stop").expect("write the stop file");
        self.wait(Duration::from_secs(120));
        for line in self.output.lock().unwrap().iter() {
            println!("{line}");
        }
        let report: Value =
            serde_json::from_str(&std::fs::read_to_string(report_path).expect("workload report"))
                .expect("report is JSON");
        println!("{}", serde_json::to_string_pretty(&report).unwrap());
        report
    }

    /// Waits for the workload to exit on its own (after the stop file appeared).
    pub fn wait(&mut self, timeout: Duration) {
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
pub fn ctl_json(meta: &str, args: &[&str]) -> Value {
    let out = run(Command::new(env!("CARGO_BIN_EXE_keyway"))
        .args(["ctl", "--meta", meta, "--json"])
        .args(args)
        .env("KEYWAY_LOG", "warn"));
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("ctl {args:?} --json: {e}\n{out}"))
}

/// The map: partition id -> owner node id, and node id -> RESP address.
pub fn read_map(meta: &str) -> (BTreeMap<u64, u64>, BTreeMap<u64, String>) {
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

/// Asserts the workload's report shows it ran and nothing went wrong: no
/// error, stale or phantom read, lost write, TRYAGAIN or hung thread.
pub fn assert_report_clean(report: &Value) {
    let count = |field: &str| {
        report[field]
            .as_u64()
            .unwrap_or_else(|| panic!("report has no count {field:?}: {report}"))
    };
    assert!(
        report["started"].as_bool() == Some(true),
        "workload never started"
    );
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
}

/// Keys each workload thread owns: 200 plain ones and 16 hash-tagged pairs.
pub const KEYS_PER_THREAD: u64 = 200 + 2 * 16;

/// Asserts the workload really ran: enough writes, reads and multi-key
/// operations, and a final pass that read back every key of `threads` threads.
pub fn assert_report_ran(report: &Value, threads: usize) {
    let count = |field: &str| {
        report[field]
            .as_u64()
            .unwrap_or_else(|| panic!("report has no count {field:?}: {report}"))
    };
    assert!(
        count("writes") >= 1000,
        "too few writes: {}",
        count("writes")
    );
    assert!(count("reads") >= 1000, "too few reads: {}", count("reads"));
    assert!(count("multi_key_ops") >= 100, "too few multi-key ops");
    assert_eq!(
        count("verified"),
        threads as u64 * KEYS_PER_THREAD,
        "the final pass did not read every key back"
    );
}
