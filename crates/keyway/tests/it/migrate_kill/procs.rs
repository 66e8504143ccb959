//! The processes under test: a `keyway` daemon that can be killed -9 and
//! restarted with the same arguments (its log appended to a file in the
//! test's temp dir), and the cluster of them (meta, three servers, a
//! manager) with the log tails printed, and the dir kept, on failure.

use super::client::Conn;
use super::{
    CLEANUP_GRACE_MS, COPY_BYTES_PER_SEC, FENCE_TIMEOUT_MS, LEASE_TTL_MS, STUCK_TIMEOUT_MS, WAIT,
};
use crate::common::{free_port_block, run};
use keyway_map::{NodeId, PartitionMap};
use keyway_resp::Frame;
use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const LOG_FILTER: &str = "info,fjall=warn,lsm_tree=warn,h2=warn,tower=warn,hyper=warn";

/// A `keyway` process that can be killed -9 and restarted with the same args.
/// stdout lines go to a channel; stderr (the log) is appended to `log`.
pub struct Daemon {
    pub label: String,
    args: Vec<String>,
    ready: &'static str,
    pub log: PathBuf,
    child: Option<Child>,
    lines: Option<mpsc::Receiver<String>>,
    incarnation: u32,
}

impl Daemon {
    pub fn start(label: &str, args: Vec<String>, ready: &'static str, logs: &Path) -> Daemon {
        let mut d = Daemon {
            label: label.to_string(),
            args,
            ready,
            log: logs.join(format!("{label}.log")),
            child: None,
            lines: None,
            incarnation: 0,
        };
        d.spawn();
        d
    }

    fn spawn(&mut self) {
        assert!(self.child.is_none());
        self.incarnation += 1;
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        writeln!(
            log,
            "===== test: starting {} incarnation {} =====",
            self.label, self.incarnation
        )
        .unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_keyway"))
            .args(&self.args)
            .env("KEYWAY_LOG", LOG_FILTER)
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn keyway");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        self.child = Some(child);
        self.lines = Some(rx);
        self.wait_line(self.ready, WAIT);
    }

    /// Waits for a stdout line containing `text`.
    pub fn wait_line(&self, text: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        let lines = self.lines.as_ref().unwrap();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) if line.contains(text) => return line,
                Ok(_) => {}
                Err(e) => panic!(
                    "{} (incarnation {}): no stdout line containing {text:?}: {e}",
                    self.label, self.incarnation
                ),
            }
        }
    }

    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.lines = None;
    }

    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    /// Panics if the process exited on its own (a crash, a panic).
    pub fn assert_alive(&mut self) {
        if let Some(child) = self.child.as_mut()
            && let Some(status) = child.try_wait().unwrap()
        {
            panic!(
                "{} (incarnation {}) exited by itself: {status}",
                self.label, self.incarnation
            );
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill9();
    }
}

pub struct Cluster {
    pub meta: Daemon,
    pub servers: Vec<Daemon>,
    pub manager: Daemon,
    pub meta_url: String,
    pub ports: Vec<u16>,
    pub logs: PathBuf,
    dir: Option<tempfile::TempDir>,
}

impl Cluster {
    pub fn start() -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let logs = dir.path().join("logs");
        std::fs::create_dir_all(&logs).unwrap();
        let base = free_port_block(8);
        let meta_addr = format!("127.0.0.1:{base}");
        let meta_url = format!("keyway://{meta_addr}");
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let meta = Daemon::start(
            "meta",
            s(&[
                "meta",
                "--listen",
                &meta_addr,
                "--data",
                &dir.path().join("meta").display().to_string(),
            ]),
            "keyway meta listening",
            &logs,
        );
        let ports: Vec<u16> = (1..=3).map(|i| base + i).collect();
        let servers = (0..3)
            .map(|i| {
                Daemon::start(
                    &format!("server{i}"),
                    s(&[
                        "server",
                        "--meta",
                        &meta_url,
                        "--listen",
                        &format!("127.0.0.1:{}", ports[i]),
                        "--admin-listen",
                        &format!("127.0.0.1:{}", base + 4 + i as u16),
                        "--data",
                        &dir.path().join(format!("n{i}")).display().to_string(),
                        "--bootstrap-nodes",
                        "3",
                        "--lease-ttl-ms",
                        &LEASE_TTL_MS.to_string(),
                    ]),
                    "serving",
                    &logs,
                )
            })
            .collect();
        let manager = Daemon::start(
            "manager",
            s(&[
                "manager",
                "--meta",
                &meta_url,
                "--name",
                "mgr",
                "--no-rebalance",
                "--admin-listen",
                &format!("127.0.0.1:{}", base + 7),
                "--lease-ttl-ms",
                &LEASE_TTL_MS.to_string(),
                "--migration-stuck-timeout-ms",
                &STUCK_TIMEOUT_MS.to_string(),
                "--migration-fence-timeout-ms",
                &FENCE_TIMEOUT_MS.to_string(),
                "--migration-cleanup-grace-ms",
                &CLEANUP_GRACE_MS.to_string(),
                "--migration-max-bytes-per-sec",
                &COPY_BYTES_PER_SEC.to_string(),
            ]),
            "manager mgr",
            &logs,
        );
        Cluster {
            meta,
            servers,
            manager,
            meta_url,
            ports,
            logs,
            dir: Some(dir),
        }
    }

    /// Runs `keyway ctl --meta URL ARGS...`; its stdout (it must succeed).
    pub fn ctl(&self, args: &[&str]) -> String {
        run(Command::new(env!("CARGO_BIN_EXE_keyway"))
            .args(["ctl", "--meta", &self.meta_url])
            .args(args)
            .env("KEYWAY_LOG", "warn"))
    }

    /// Which of `servers` is `node`.
    pub fn server_index(&self, map: &PartitionMap, node: NodeId) -> usize {
        let addr = &map.nodes[&node].resp_addr;
        self.ports
            .iter()
            .position(|p| *addr == format!("127.0.0.1:{p}"))
            .unwrap_or_else(|| panic!("node {node} at {addr} is none of ours"))
    }

    /// The meta, the servers and the manager, in that order.
    pub fn daemons(&self) -> impl Iterator<Item = &Daemon> {
        std::iter::once(&self.meta)
            .chain(self.servers.iter())
            .chain(std::iter::once(&self.manager))
    }

    pub fn assert_all_alive(&mut self) {
        self.meta.assert_alive();
        self.manager.assert_alive();
        for s in &mut self.servers {
            s.assert_alive();
        }
    }

    /// Every node answers `cluster_state:ok`.
    pub fn wait_cluster_ok(&self, within: Duration) {
        let deadline = Instant::now() + within;
        for port in &self.ports {
            loop {
                let ok = Conn::connect(*port).ok().and_then(|mut c| {
                    c.request(&[b"CLUSTER", b"INFO"]).ok().map(|f| match f {
                        Frame::Bulk(b) => String::from_utf8_lossy(&b).contains("cluster_state:ok"),
                        _ => false,
                    })
                });
                if ok == Some(true) {
                    break;
                }
                assert!(Instant::now() < deadline, "node {port} never reached ok");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let keep = std::env::var_os("KEYWAY_TEST_KEEP").is_some();
        if keep && let Some(dir) = self.dir.take() {
            eprintln!("logs and data kept in {}", dir.keep().display());
        }
        if std::thread::panicking() {
            for d in self.daemons() {
                eprintln!(
                    "----- last lines of {} -----\n{}",
                    d.log.display(),
                    tail(&d.log, 80)
                );
            }
            if let Some(dir) = self.dir.take() {
                eprintln!("logs and data kept in {}", dir.keep().display());
            }
        }
    }
}
