//! Test harness pieces shared by the integration tests: run `keyway dev` as
//! a real process on free ports, wait for it, stop it, and talk RESP to it.

#![allow(dead_code)]

pub mod certs;
pub mod crash_writers;
pub mod replica;
pub mod workload;

use bytes::{Bytes, BytesMut};
use keyway_resp::{Frame, Limits, Protocol, ResponseParser, encode};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A manager for tests that drive moves themselves: no rebalancing,
/// splitting or merging of its own, a migration's source cleaned 200 ms
/// after the flip, and with `quick`, a driver that polls every 20 ms and
/// discovers new records every 50 ms.
pub fn manager_without_policies(quick: bool) -> keyway_cluster::ManagerSpec {
    let mut m = keyway_cluster::ManagerSpec::default();
    m.config.driver.migration.cleanup_grace_ms = 200;
    if quick {
        m.config.driver.poll_interval_ms = 20;
        m.config.driver.discover_interval_ms = 50;
    }
    m.config.rebalance.enabled = false;
    m.config.split.enabled = false;
    m.config.merge.enabled = false;
    m
}

/// A key of slot `slot` (a hash tag found by search), ending in `suffix`.
pub fn key_in_slot(slot: u16, suffix: &str) -> String {
    let tag = (0..1_000_000)
        .map(|i| format!("t{i}"))
        .find(|t| keyway_map::key_hash_slot(t.as_bytes()) == slot)
        .expect("every slot has a short hash tag");
    format!("{{{tag}}}{suffix}")
}

/// A `keyway dev` process.
pub struct DevCluster {
    pub child: Option<Child>,
    pub first_port: u16,
    pub meta_port: u16,
    pub admin_port: u16,
    pub nodes: usize,
    pub data: PathBuf,
    pub stdout: Vec<String>,
}

/// The `keyway` binary the clusters run: `KEYWAY_TEST_BIN` if set (e.g. a
/// release build for a long measured run), else the one cargo built for
/// this test. A relative path is taken from the workspace root (cargo runs
/// the tests in the crate's directory).
pub fn keyway_bin() -> String {
    match std::env::var("KEYWAY_TEST_BIN") {
        Ok(bin) => Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(bin)
            .display()
            .to_string(),
        Err(_) => env!("CARGO_BIN_EXE_keyway").to_string(),
    }
}

/// `count` consecutive free ports below the ephemeral range (see
/// [`keyway_testkit::free_port_block`]).
pub fn free_port_block(count: usize) -> u16 {
    keyway_testkit::free_port_block(count)
}

impl DevCluster {
    /// Starts `keyway dev` with `nodes` nodes in `data`, waiting until it says it is up.
    pub fn start(nodes: usize, data: &Path, extra: &[&str]) -> DevCluster {
        let base = free_port_block(2 * nodes + 2);
        Self::start_on(nodes, data, base, extra)
    }

    /// Starts on a known port block (for restarts on the same ports).
    /// One copy per partition unless `extra` asks for a replication factor
    /// (`keyway dev` defaults to 2; the tests written before replication
    /// assume one).
    pub fn start_on(nodes: usize, data: &Path, base: u16, extra: &[&str]) -> DevCluster {
        let (meta_port, first_port, admin_port) = (base, base + 1, base + 1 + nodes as u16);
        let rf: &[&str] = if extra.contains(&"--replication-factor") {
            &[]
        } else {
            &["--replication-factor", "1"]
        };
        // `keyway dev` makes a cluster secret by default; the tests that
        // read admin ports and run `ctl` without one ask for none, the
        // secret's own tests (`cluster_secret.rs`) pass theirs.
        let secret: &[&str] = if extra.contains(&"--cluster-secret-file") {
            &[]
        } else {
            &["--no-cluster-secret"]
        };
        let mut child = Command::new(keyway_bin())
            .args(["dev", "--nodes", &nodes.to_string()])
            .args(rf)
            .args(secret)
            .args([
                "--port",
                &first_port.to_string(),
                "--admin-port",
                &admin_port.to_string(),
            ])
            .args(["--meta-port", &meta_port.to_string()])
            .args([
                "--manager-admin-port",
                &(admin_port + nodes as u16).to_string(),
            ])
            .arg("--data")
            .arg(data)
            .args(extra)
            .env("KEYWAY_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn keyway dev");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut lines = BufReader::new(stdout).lines();
        let mut seen = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        for line in lines.by_ref() {
            let line = line.expect("read keyway dev output");
            let up = line.starts_with("Ctrl-C stops");
            seen.push(line);
            if up {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "keyway dev did not come up: {seen:?}"
            );
        }
        assert!(
            seen.iter().any(|l| l.starts_with("Ctrl-C stops")),
            "keyway dev exited early: {seen:?}"
        );
        // Keep draining stdout so the process never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        DevCluster {
            child: Some(child),
            first_port,
            meta_port,
            admin_port,
            nodes,
            data: data.to_path_buf(),
            stdout: seen,
        }
    }

    pub fn base(&self) -> u16 {
        self.meta_port
    }

    pub fn ports(&self) -> Vec<u16> {
        (0..self.nodes as u16)
            .map(|i| self.first_port + i)
            .collect()
    }

    /// Ctrl-C, then waits for a clean exit.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            unsafe_free_sigint(child.id());
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                if let Some(status) = child.try_wait().expect("wait keyway dev") {
                    assert!(status.success(), "keyway dev exited with {status}");
                    return;
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    panic!("keyway dev did not stop within 30 s of SIGINT");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

impl Drop for DevCluster {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Sends SIGINT through the `kill` command (no unsafe code, no libc dependency).
fn unsafe_free_sigint(pid: u32) {
    let status = Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
}

/// Runs a command and returns its stdout, asserting success.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs the real `redis-cli -p PORT ARGS...` and returns its trimmed output.
pub fn redis_cli(port: u16, args: &[&str]) -> String {
    run(Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args))
    .trim_end()
    .to_string()
}

/// A `keyway` child process, killed when dropped.
pub struct Proc(pub Child);

impl Proc {
    /// Spawns `keyway ARGS` and waits for its first stdout line, which must contain `ready`.
    pub fn spawn(args: &[String], ready: &str) -> Proc {
        let mut child = Command::new(env!("CARGO_BIN_EXE_keyway"))
            .args(args)
            .env("KEYWAY_LOG", "warn")
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn keyway");
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let line = lines.next().expect("keyway printed nothing").unwrap();
        assert!(line.contains(ready), "unexpected first line {line:?}");
        std::thread::spawn(move || for _ in lines {});
        Proc(child)
    }

    fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .args([sig, &self.0.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {sig} failed");
    }

    /// SIGSTOP: the process freezes, its sockets stay open.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// SIGCONT.
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    /// SIGKILL and reap.
    pub fn kill9(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Spawns `count` `keyway server` processes on `meta_url`: node i listens on
/// `first_port + i`, its admin port on `first_port + count + i`, its data in
/// `dir/n<i>`; `extra` flags go to every server. Returns the RESP ports.
pub fn spawn_servers(
    meta_url: &str,
    count: u16,
    first_port: u16,
    dir: &Path,
    extra: &[String],
) -> (Vec<u16>, Vec<Proc>) {
    let ports: Vec<u16> = (0..count).map(|i| first_port + i).collect();
    let procs = ports
        .iter()
        .enumerate()
        .map(|(i, port)| {
            let mut args: Vec<String> = vec![
                "server".into(),
                "--meta".into(),
                meta_url.into(),
                "--listen".into(),
                format!("127.0.0.1:{port}"),
                "--admin-listen".into(),
                format!("127.0.0.1:{}", first_port + count + i as u16),
                "--data".into(),
                dir.join(format!("n{i}")).display().to_string(),
            ];
            args.extend(extra.iter().cloned());
            Proc::spawn(&args, "serving")
        })
        .collect();
    (ports, procs)
}

/// A blocking RESP connection for tests.
pub struct Resp {
    pub stream: TcpStream,
    buf: BytesMut,
    parser: ResponseParser,
}

impl Resp {
    pub fn connect(port: u16) -> Resp {
        let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        Resp {
            stream,
            buf: BytesMut::new(),
            parser: ResponseParser::new(Limits::default()),
        }
    }

    /// Like [`Resp::connect`], but an error instead of a panic (a node
    /// that is down), with `timeout` for the connect and every reply.
    pub fn try_connect(port: u16, timeout: Duration) -> std::io::Result<Resp> {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        Ok(Resp {
            stream,
            buf: BytesMut::new(),
            parser: ResponseParser::new(Limits::default()),
        })
    }

    /// Like [`Resp::cmd`], but an I/O error (or a timeout) instead of a panic.
    pub fn try_cmd(&mut self, args: &[&str]) -> std::io::Result<Frame> {
        let mut out = BytesMut::new();
        let frame = Frame::Array(
            args.iter()
                .map(|a| Frame::Bulk(Bytes::copy_from_slice(a.as_bytes())))
                .collect(),
        );
        encode(&frame, Protocol::Resp2, &mut out);
        self.stream.write_all(&out)?;
        self.read_reply()
    }

    pub fn send_raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes)
    }

    pub fn cmd(&mut self, args: &[&str]) -> Frame {
        let mut out = BytesMut::new();
        let frame = Frame::Array(
            args.iter()
                .map(|a| Frame::Bulk(Bytes::copy_from_slice(a.as_bytes())))
                .collect(),
        );
        encode(&frame, Protocol::Resp2, &mut out);
        self.stream.write_all(&out).expect("write");
        self.read_reply().expect("reply")
    }

    pub fn read_reply(&mut self) -> std::io::Result<Frame> {
        loop {
            if let Some(frame) = self
                .parser
                .parse(&mut self.buf)
                .map_err(|e| std::io::Error::other(e.to_string()))?
            {
                return Ok(frame);
            }
            let mut chunk = [0u8; 16 * 1024];
            let n = match self.stream.read(&mut chunk) {
                // A signal to this process (a test that stops and resumes a
                // child gets SIGCHLD) interrupts the read: read again.
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                other => other?,
            };
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

/// A plain HTTP/1.1 GET on 127.0.0.1: the body of a `200` answer, or `None`
/// if nothing answers or the status is not 200.
pub fn http_get(port: u16, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_string())
}
