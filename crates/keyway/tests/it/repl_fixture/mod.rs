//! A replicated cluster as separate processes, for the replication tests:
//! `keyway meta --replication-factor N --min-in-sync M`, `nodes` `keyway
//! server`s (each restartable with the same data directory and ports, and
//! freezable) and one `keyway manager`. Each process's log goes to
//! `logs/<label>.log` in the cluster's directory, which is kept (and its
//! path printed) when the test panics. The map is read with `keyway ctl
//! --json map`.

#![allow(dead_code)]

use keyway_map::{NodeId, PartitionMap, PartitionRecord};
use keyway_testkit::Proc;
use std::fs::OpenOptions;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// How long a process may take to print its ready line.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// The processes' log filter.
const LOG_FILTER: &str = "info,fjall=warn,lsm_tree=warn,h2=warn,tower=warn,hyper=warn";

/// The `keyway` binary the processes run: `KEYWAY_TEST_BIN` if set (e.g. a
/// release build for a long measured run), else the one cargo built for
/// this test.
pub fn keyway_bin() -> String {
    std::env::var("KEYWAY_TEST_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_keyway").to_string())
}

/// What to start.
#[derive(Clone, Debug)]
pub struct ReplSpec {
    pub nodes: usize,
    pub partitions_per_node: u16,
    pub replication_factor: u8,
    pub min_in_sync: u8,
    pub lease_ttl_ms: u64,
    pub lease_margin_ms: u64,
    pub replica_lag_timeout_ms: u64,
    pub replica_read_lease_ms: u64,
    /// The nodes' `--replica-stream-window-calls`: 4 here, so the
    /// replication tests run the pipelined stream (nodes default to 1).
    pub replica_stream_window_calls: u64,
    /// More `keyway manager` flags (e.g. `--rebalance-down-grace-ms`).
    pub manager_flags: Vec<String>,
    /// More `keyway server` flags, for every node.
    pub node_flags: Vec<String>,
}

impl ReplSpec {
    /// The processes' replication flags, as the nemesis harness builds them.
    fn replication(&self) -> keyway_nemesis::ReplicationFlags {
        keyway_nemesis::ReplicationFlags {
            replication_factor: self.replication_factor,
            min_in_sync: self.min_in_sync,
            node_lease_margin_ms: self.lease_margin_ms,
            replica_lag_timeout_ms: self.replica_lag_timeout_ms,
            replica_read_lease_ms: self.replica_read_lease_ms,
            replica_stream_window_calls: self.replica_stream_window_calls,
        }
    }
}

impl Default for ReplSpec {
    fn default() -> Self {
        ReplSpec {
            nodes: 3,
            partitions_per_node: 4,
            replication_factor: 2,
            min_in_sync: 1,
            lease_ttl_ms: 2_000,
            lease_margin_ms: 500,
            replica_lag_timeout_ms: 1_500,
            replica_read_lease_ms: 750,
            replica_stream_window_calls: 4,
            manager_flags: Vec::new(),
            node_flags: Vec::new(),
        }
    }
}

/// One restartable process.
struct Daemon {
    label: String,
    args: Vec<String>,
    ready: String,
    log: PathBuf,
    proc: Option<Proc>,
}

impl Daemon {
    fn start(&mut self) {
        assert!(self.proc.is_none(), "{} is running", self.label);
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let mut cmd = Command::new(keyway_bin());
        cmd.args(&self.args)
            .env("KEYWAY_LOG", LOG_FILTER)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log));
        let mut proc = Proc::spawn(&self.label, &mut cmd).unwrap();
        let stdout = proc.child_mut().stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        loop {
            match rx.recv_timeout(START_TIMEOUT) {
                Ok(line) if line.contains(&self.ready) => break,
                Ok(_) => {}
                Err(e) => panic!(
                    "{} did not print {:?} ({e}); log:\n{}",
                    self.label,
                    self.ready,
                    tail(&self.log)
                ),
            }
        }
        self.proc = Some(proc);
    }

    fn kill9(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill9();
        }
    }

    fn running(&self) -> &Proc {
        self.proc
            .as_ref()
            .unwrap_or_else(|| panic!("{} is not running", self.label))
    }
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// The running cluster; every process is killed on drop.
pub struct ReplCluster {
    pub spec: ReplSpec,
    pub meta_url: String,
    /// Node i's RESP port and admin port.
    pub ports: Vec<u16>,
    pub admin_ports: Vec<u16>,
    /// The manager's admin port (`/status`, `/decisions`).
    pub manager_admin_port: u16,
    meta: Daemon,
    nodes: Vec<Daemon>,
    manager: Daemon,
    dir: Option<tempfile::TempDir>,
}

impl ReplCluster {
    /// Starts the store (which bootstraps keyspace 0 with the spec's
    /// replication factor once every node registered), the nodes and the manager.
    pub fn start(spec: ReplSpec) -> ReplCluster {
        let dir = tempfile::tempdir().unwrap();
        let logs = dir.path().join("logs");
        std::fs::create_dir_all(&logs).unwrap();
        let ports = keyway_testkit::free_ports(2 + 2 * spec.nodes);
        let meta_addr = format!("127.0.0.1:{}", ports[0]);
        let meta_url = format!("keyway://{meta_addr}");
        let path = |name: &str| dir.path().join(name).display().to_string();
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<String>>();
        let daemon = |label: &str, args: Vec<String>, ready: &str| Daemon {
            label: label.to_string(),
            args,
            ready: ready.to_string(),
            log: logs.join(format!("{label}.log")),
            proc: None,
        };
        let mut meta = daemon(
            "meta",
            s(&[
                "meta",
                "--listen",
                &meta_addr,
                "--data",
                &path("meta"),
                "--bootstrap-nodes",
                &spec.nodes.to_string(),
                "--partitions-per-node",
                &spec.partitions_per_node.to_string(),
            ])
            .into_iter()
            .chain(spec.replication().bootstrap())
            .collect(),
            "keyway meta listening",
        );
        meta.start();
        let resp: Vec<u16> = (0..spec.nodes).map(|i| ports[2 + 2 * i]).collect();
        let admin: Vec<u16> = (0..spec.nodes).map(|i| ports[3 + 2 * i]).collect();
        let mut nodes = Vec::new();
        for i in 0..spec.nodes {
            let mut node = daemon(
                &format!("node{i}"),
                s(&[
                    "server",
                    "--meta",
                    &meta_url,
                    "--listen",
                    &format!("127.0.0.1:{}", resp[i]),
                    "--admin-listen",
                    &format!("127.0.0.1:{}", admin[i]),
                    "--data",
                    &path(&format!("node{i}")),
                    "--lease-ttl-ms",
                    &spec.lease_ttl_ms.to_string(),
                    "--lease-margin-ms",
                    &spec.lease_margin_ms.to_string(),
                ])
                .into_iter()
                .chain(spec.replication().node())
                .chain(spec.node_flags.iter().cloned())
                .collect(),
                "serving redis://",
            );
            node.start();
            nodes.push(node);
        }
        let mut manager = daemon(
            "mgr0",
            s(&[
                "manager",
                "--meta",
                &meta_url,
                "--name",
                "mgr0",
                "--admin-listen",
                &format!("127.0.0.1:{}", ports[1]),
                "--lease-ttl-ms",
                "2000",
                "--no-rebalance",
                "--no-auto-split",
                "--no-auto-merge",
            ])
            .into_iter()
            .chain(spec.replication().manager())
            .chain(spec.manager_flags.iter().cloned())
            .collect(),
            "manager mgr0 ",
        );
        manager.start();
        let cluster = ReplCluster {
            spec,
            meta_url,
            ports: resp,
            admin_ports: admin,
            manager_admin_port: ports[1],
            meta,
            nodes,
            manager,
            dir: Some(dir),
        };
        // Its ready line comes before it wins the seat: a node killed
        // before that is failed over only after the new leader's wait.
        keyway_testkit::wait_until("mgr0 to lead", START_TIMEOUT, || {
            let (ok, out, _) = cluster.ctl(&["--json", "manager"]);
            let v: serde_json::Value = serde_json::from_str(&out).ok()?;
            (ok && v["leader"] == "mgr0").then_some(())
        })
        .unwrap();
        cluster
    }

    /// The cluster's directory (data and `logs/`).
    pub fn dir(&self) -> &Path {
        self.dir.as_ref().unwrap().path()
    }

    /// `keyway ctl --meta URL ARGS...`: (success, stdout, stderr).
    pub fn ctl(&self, args: &[&str]) -> (bool, String, String) {
        let out = Command::new(keyway_bin())
            .args(["ctl", "--meta", &self.meta_url])
            .args(args)
            .env("KEYWAY_LOG", "error")
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// The map as `keyway ctl --json map` prints it (indexed), if it can be read.
    pub fn map(&self) -> Option<PartitionMap> {
        let (ok, out, _) = self.ctl(&["--json", "map"]);
        if !ok {
            return None;
        }
        let mut map: PartitionMap = serde_json::from_str(&out).ok()?;
        map.reindex();
        Some(map)
    }

    /// Node i's id in the map.
    pub fn node_id(&self, map: &PartitionMap, i: usize) -> NodeId {
        let addr = format!("127.0.0.1:{}", self.ports[i]);
        map.nodes
            .values()
            .find(|n| n.resp_addr == addr)
            .map(|n| n.id)
            .unwrap_or_else(|| panic!("node{i} ({addr}) is not in the map"))
    }

    /// Which node index has id `id`.
    pub fn index_of(&self, map: &PartitionMap, id: NodeId) -> usize {
        let addr = &map.nodes[&id].resp_addr;
        self.ports
            .iter()
            .position(|p| *addr == format!("127.0.0.1:{p}"))
            .unwrap_or_else(|| panic!("{addr} is no node of this cluster"))
    }

    /// The partitions of keyspace 0, by start.
    pub fn partitions(map: &PartitionMap) -> Vec<PartitionRecord> {
        map.keyspace_partitions(keyway_map::DEFAULT_KEYSPACE)
            .cloned()
            .collect()
    }

    /// The map once every partition of keyspace 0 has all its copies in
    /// sync (replication factor copies, the primary included).
    pub fn all_in_sync(&self) -> Option<PartitionMap> {
        let map = self.map()?;
        let rf = usize::from(self.spec.replication_factor);
        let parts = Self::partitions(&map);
        (!parts.is_empty() && parts.iter().all(|p| p.in_sync_copies() == rf)).then_some(map)
    }

    pub fn kill(&mut self, i: usize) {
        self.nodes[i].kill9();
    }

    /// Starts node `i` again (same data directory and ports).
    pub fn restart(&mut self, i: usize) {
        self.nodes[i].kill9();
        self.nodes[i].start();
    }

    /// SIGSTOP.
    pub fn pause(&self, i: usize) {
        self.nodes[i].running().pause().unwrap();
    }

    /// SIGCONT.
    pub fn resume(&self, i: usize) {
        self.nodes[i].running().resume().unwrap();
    }

    /// Node i's log so far (for failure messages).
    pub fn log_tail(&self, i: usize) -> String {
        tail(&self.nodes[i].log)
    }
}

impl Drop for ReplCluster {
    fn drop(&mut self) {
        // Thaw first: a frozen process does not die of SIGKILL until resumed
        // on every kernel, and its sockets would linger.
        for n in &self.nodes {
            if let Some(p) = &n.proc {
                let _ = p.resume();
            }
        }
        self.manager.kill9();
        for n in &mut self.nodes {
            n.kill9();
        }
        self.meta.kill9();
        if std::thread::panicking()
            && let Some(dir) = self.dir.take()
        {
            eprintln!("cluster data and logs kept in {}", dir.keep().display());
        }
    }
}

/// `tests/py/failover_rw.py` (redis-py `RedisCluster`, one worker per slot
/// group, read before write) running against a cluster: started once it
/// acknowledged a write to every group, told of kills, stopped for its report.
pub struct RwWorkload {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    lines: mpsc::Receiver<String>,
    report: PathBuf,
}

impl RwWorkload {
    /// Starts the workload on `ports` over the slot `groups` ("a-b") and
    /// waits for its "ready" line.
    pub fn start(ports: &[u16], groups: &[String], report: PathBuf) -> RwWorkload {
        let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/failover_rw.py");
        let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
        let mut child = Command::new(python)
            .arg(script)
            .arg(ports.join(","))
            .arg(groups.join(","))
            .arg(&report)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run python3 (redis-py)");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        assert_eq!(
            lines.recv_timeout(Duration::from_secs(60)).as_deref(),
            Ok("ready"),
            "the workload never acknowledged a write to every partition"
        );
        RwWorkload {
            child,
            stdin,
            lines,
            report,
        }
    }

    /// Tells the workload a node was killed now (its recovery times are
    /// measured from here).
    pub fn killed_now(&mut self) {
        use std::io::Write;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        writeln!(self.stdin, "kill {now}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// Stops the workload (it reads every key back) and returns its report.
    pub fn stop(mut self) -> serde_json::Value {
        use std::io::Write;
        writeln!(self.stdin, "stop").unwrap();
        self.stdin.flush().unwrap();
        assert_eq!(
            self.lines.recv_timeout(Duration::from_secs(180)).as_deref(),
            Ok("done"),
            "the workload did not finish"
        );
        let status = self.child.wait().unwrap();
        assert!(status.success(), "failover_rw.py exited with {status}");
        serde_json::from_str(&std::fs::read_to_string(&self.report).unwrap()).unwrap()
    }
}

/// Judges a `failover_rw.py` report: no acknowledged write lost, no error a
/// client must not see, every key read back at the end, and at least
/// `min_acked` acknowledged writes (else the workload did not really run).
pub fn assert_rw_report_clean(report: &serde_json::Value, min_acked: u64) {
    eprintln!(
        "workload: acked={} reads={} keys={} verified={} expected errors {}",
        report["acked"],
        report["reads"],
        report["keys"],
        report["verified"],
        report["expected_errors"]
    );
    let list = |k: &str| report[k].as_array().cloned().unwrap_or_default();
    assert!(
        list("lost").is_empty(),
        "acknowledged writes lost: {:?}",
        list("lost")
    );
    assert!(
        list("bad_errors").is_empty(),
        "errors a client must not see: {:?}",
        list("bad_errors")
    );
    assert_eq!(report["unreadable"], 0, "keys unreadable at the end");
    assert_eq!(report["verified"], report["keys"]);
    assert!(
        report["acked"].as_u64().unwrap() >= min_acked,
        "the workload did not really run: {report}"
    );
}

/// The slot groups ("a-b") of keyspace 0's partitions, one per partition.
pub fn slot_groups(map: &PartitionMap) -> Vec<String> {
    ReplCluster::partitions(map)
        .iter()
        .map(|p| {
            let (a, b) = p.slot_span();
            format!("{a}-{b}")
        })
        .collect()
}
