//! [`EtcdCluster`]: real `etcd` members on loopback ports, for tests.

use crate::{HarnessError, Proc, free_ports, wait_until};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Raft heartbeat of test members (etcd's default is 100 ms).
pub const HEARTBEAT_INTERVAL_MS: u64 = 50;
/// Raft election timeout of test members (etcd's default is 1000 ms): a
/// killed leader is replaced within about this long.
pub const ELECTION_TIMEOUT_MS: u64 = 500;
/// How long [`EtcdCluster::start`] and [`EtcdCluster::restart_member`] wait
/// for members to answer.
pub const START_DEADLINE: Duration = Duration::from_secs(30);

/// The environment variable that overrides where `etcd` is found.
const ETCD_ENV: &str = "KEYWAY_ETCD";

/// The `etcd` binary: `$KEYWAY_ETCD` if set, else the first `etcd` on
/// `PATH`. Fails with [`HarnessError::NotInstalled`] (which tells to run
/// `scripts/setup.sh`) when there is none.
pub fn etcd_binary() -> Result<PathBuf, HarnessError> {
    if let Some(path) = std::env::var_os(ETCD_ENV) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(HarnessError::NotInstalled {
                binary: format!("{} (from ${ETCD_ENV})", path.display()),
                package: "etcd-server".into(),
            })
        };
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("etcd"))
        .find(|p| p.is_file())
        .ok_or_else(|| HarnessError::NotInstalled {
            binary: "etcd".into(),
            package: "etcd-server".into(),
        })
}

/// One member's fixed identity: what a restart reuses.
#[derive(Debug)]
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    data_dir: PathBuf,
    log: PathBuf,
    proc: Option<Proc>,
}

impl Member {
    fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer_port)
    }
    fn client_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }
}

/// A real etcd cluster of `n` members on 127.0.0.1, for tests.
///
/// Every member has free client and peer ports, its own data directory and
/// log file (stdout and stderr, appended across restarts) inside one
/// temporary directory, and test timings (heartbeat
/// [`HEARTBEAT_INTERVAL_MS`], election timeout [`ELECTION_TIMEOUT_MS`]).
/// Dropping the cluster kills every member and removes the directory; a
/// cluster never dropped (shared through a `static`) is cleaned up by its
/// tether process when the test process exits.
///
/// ```no_run
/// let mut etcd = keyway_testkit::EtcdCluster::start(3)?;
/// let url = etcd.url("/keyway/test"); // etcd://127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3/keyway/test
/// etcd.kill_member(0);
/// etcd.restart_member(0)?;
/// etcd.wait_healthy()?;
/// # Ok::<(), keyway_testkit::HarnessError>(())
/// ```
#[derive(Debug)]
pub struct EtcdCluster {
    binary: PathBuf,
    token: String,
    members: Vec<Member>,
    /// Kills the members and removes `dir` when this process exits without
    /// dropping the cluster (a `static`, a panic with abort, SIGKILL).
    tether: Option<Proc>,
    // Dropped last: after the members are killed.
    dir: tempfile::TempDir,
}

/// The tether: a shell that blocks reading its stdin, a pipe only this
/// process holds open. When this process ends for any reason the pipe closes,
/// `read` returns, and it kills every member whose pid file is there and
/// removes the directory. Pid files are written on spawn and removed when a
/// member is killed and reaped, so no stale pid is ever signalled.
const TETHER: &str = r#"read _ignored; for f in "$1"/*.pid; do [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null; done; rm -rf "$1""#;

impl EtcdCluster {
    /// Starts `members` (>= 1; 1 or 3 in practice) etcd processes forming a
    /// new cluster, and waits (at most [`START_DEADLINE`]) until every member
    /// reports itself healthy, i.e. the cluster has a leader and answers a
    /// read through it.
    pub fn start(members: usize) -> Result<Self, HarnessError> {
        if members == 0 {
            return Err(HarnessError::Invalid(
                "an etcd cluster needs at least one member".into(),
            ));
        }
        let binary = etcd_binary()?;
        let dir = tempfile::Builder::new()
            .prefix("keyway-etcd-")
            .tempdir()
            .map_err(|e| HarnessError::io("create a temporary directory for etcd", e))?;
        let ports = free_ports(2 * members);
        let members: Vec<Member> = (0..members)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: ports[2 * i],
                peer_port: ports[2 * i + 1],
                data_dir: dir.path().join(format!("m{i}.etcd")),
                log: dir.path().join(format!("m{i}.log")),
                proc: None,
            })
            .collect();
        let tether = Proc::spawn(
            "etcd tether",
            Command::new("sh")
                .args(["-c", TETHER, "keyway-etcd-tether"])
                .arg(dir.path())
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        )?;
        let mut cluster = EtcdCluster {
            binary,
            token: format!("keyway-test-{:016x}", rand::random::<u64>()),
            members,
            tether: Some(tether),
            dir,
        };
        for i in 0..cluster.members.len() {
            cluster.spawn(i)?;
        }
        cluster.wait_healthy()?;
        Ok(cluster)
    }

    /// How many members the cluster was started with.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Always false: a cluster has at least one member.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Every member's client endpoint, `127.0.0.1:PORT`, in member order
    /// (also those of members that are down).
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect()
    }

    /// Member `i`'s client port.
    pub fn client_port(&self, i: usize) -> u16 {
        self.members[i].client_port
    }

    /// A Keyway metadata-store URL for this cluster:
    /// `etcd://127.0.0.1:P1,127.0.0.1:P2/<prefix>` (`prefix` with or without
    /// its leading `/`).
    pub fn url(&self, prefix: &str) -> String {
        format!(
            "etcd://{}/{}",
            self.endpoints().join(","),
            prefix.trim_start_matches('/')
        )
    }

    /// The temporary directory holding every member's data and log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Member `i`'s log file.
    pub fn log_path(&self, i: usize) -> &Path {
        &self.members[i].log
    }

    /// Whether member `i`'s process is running (false once killed).
    pub fn is_running(&mut self, i: usize) -> bool {
        self.members[i]
            .proc
            .as_mut()
            .is_some_and(|p| p.is_running())
    }

    /// SIGKILLs member `i` (no-op if it is down already) and reaps it.
    pub fn kill_member(&mut self, i: usize) {
        if let Some(mut p) = self.members[i].proc.take() {
            p.kill9();
            let _ = std::fs::remove_file(self.pid_file(i));
        }
    }

    /// SIGSTOPs member `i`: it stops answering but keeps its sockets open.
    pub fn pause_member(&self, i: usize) -> Result<(), HarnessError> {
        self.member_proc(i)?.pause()
    }

    /// SIGCONTs member `i` after [`Self::pause_member`].
    pub fn resume_member(&self, i: usize) -> Result<(), HarnessError> {
        self.member_proc(i)?.resume()
    }

    /// Starts member `i` again on the same ports and data directory (it
    /// rejoins from its write-ahead log), killing it first if it still runs,
    /// and waits until its client port answers HTTP. It serves requests only
    /// once it has a leader again, which needs a quorum of members running:
    /// use [`Self::wait_healthy`] for that.
    pub fn restart_member(&mut self, i: usize) -> Result<(), HarnessError> {
        if i >= self.members.len() {
            return Err(HarnessError::Invalid(format!(
                "no member {i}: the cluster has {}",
                self.members.len()
            )));
        }
        self.kill_member(i);
        self.spawn(i)?;
        let port = self.members[i].client_port;
        let what = format!("restarted etcd member {} to answer", self.members[i].name);
        wait_until(&what, START_DEADLINE, || health(port).map(|_| ()))
            .map_err(|e| self.with_log_tail(i, e))
    }

    /// Waits (at most [`START_DEADLINE`]) until every running member
    /// reports itself healthy on `GET /health`.
    pub fn wait_healthy(&mut self) -> Result<(), HarnessError> {
        for i in 0..self.members.len() {
            if !self.is_running(i) {
                continue;
            }
            let port = self.members[i].client_port;
            let what = format!("etcd member {} to report healthy", self.members[i].name);
            wait_until(&what, START_DEADLINE, || health(port).filter(|ok| *ok))
                .map_err(|e| self.with_log_tail(i, e))?;
        }
        Ok(())
    }

    /// Kills every member (their data stays until the cluster is dropped).
    pub fn stop_all(&mut self) {
        for i in 0..self.members.len() {
            self.kill_member(i);
        }
    }

    fn member_proc(&self, i: usize) -> Result<&Proc, HarnessError> {
        self.members
            .get(i)
            .and_then(|m| m.proc.as_ref())
            .ok_or_else(|| HarnessError::Invalid(format!("etcd member {i} is not running")))
    }

    fn spawn(&mut self, i: usize) -> Result<(), HarnessError> {
        let initial_cluster = self
            .members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect::<Vec<_>>()
            .join(",");
        let m = &self.members[i];
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&m.log)
            .map_err(|e| HarnessError::io(format!("open {}", m.log.display()), e))?;
        let _ = writeln!(log, "=== keyway-testkit: starting {} ===", m.name);
        let err_log = log
            .try_clone()
            .map_err(|e| HarnessError::io(format!("clone {}", m.log.display()), e))?;
        let mut cmd = Command::new(&self.binary);
        cmd.arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(&m.data_dir)
            .args(["--listen-client-urls", &m.client_url()])
            .args(["--advertise-client-urls", &m.client_url()])
            .args(["--listen-peer-urls", &m.peer_url()])
            .args(["--initial-advertise-peer-urls", &m.peer_url()])
            .args(["--initial-cluster", &initial_cluster])
            // Ignored on restart: a member with a data directory rejoins
            // from its write-ahead log.
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", &self.token])
            .args(["--heartbeat-interval", &HEARTBEAT_INTERVAL_MS.to_string()])
            .args(["--election-timeout", &ELECTION_TIMEOUT_MS.to_string()])
            .args(["--logger", "zap", "--log-outputs", "stderr"])
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(err_log));
        let proc = Proc::spawn(&format!("etcd member {}", m.name), &mut cmd)?;
        let pid_file = self.pid_file(i);
        self.members[i].proc = Some(proc);
        let pid = self.members[i].proc.as_ref().map_or(0, Proc::pid);
        std::fs::write(&pid_file, pid.to_string())
            .map_err(|e| HarnessError::io(format!("write {}", pid_file.display()), e))
    }

    fn pid_file(&self, i: usize) -> PathBuf {
        self.dir
            .path()
            .join(format!("{}.pid", self.members[i].name))
    }

    /// Adds member `i`'s log tail to a timeout.
    fn with_log_tail(&self, i: usize, e: HarnessError) -> HarnessError {
        match e {
            HarnessError::Timeout { what, after, .. } => HarnessError::Timeout {
                what,
                after,
                log_tail: tail(&self.members[i].log, 4096),
            },
            other => other,
        }
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        // The tether first: it must not outlive the members' pids.
        if let Some(mut tether) = self.tether.take() {
            tether.kill9();
        }
        self.stop_all();
    }
}

/// `GET /health` on a client port: `Some(true)` healthy, `Some(false)`
/// answering but unhealthy (no leader, say), `None` not answering.
fn health(port: u16) -> Option<bool> {
    let timeout = Duration::from_millis(500);
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut conn = TcpStream::connect_timeout(&addr, timeout).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
    conn.set_write_timeout(Some(timeout)).ok()?;
    conn.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut reply = Vec::new();
    conn.read_to_end(&mut reply).ok()?;
    let reply = String::from_utf8_lossy(&reply);
    if !reply.starts_with("HTTP/1.") {
        return None;
    }
    Some(reply.starts_with("HTTP/1.1 200") && reply.contains(r#""health":"true""#))
}

/// The last `max` bytes of a file (lossy UTF-8), or a note why not.
fn tail(path: &Path, max: u64) -> String {
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) => return format!("(cannot read {}: {e})", path.display()),
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut buf = Vec::new();
    use std::io::Seek;
    let _ = file.seek(std::io::SeekFrom::Start(len.saturating_sub(max)));
    let _ = file.read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_binary_says_how_to_install_it() {
        let e = HarnessError::NotInstalled {
            binary: "etcd".into(),
            package: "etcd-server".into(),
        };
        let msg = e.to_string();
        assert!(
            msg.contains("scripts/setup.sh") && msg.contains("etcd-server"),
            "{msg}"
        );
    }
}
