//! Issue 4, "Done when" item 2: kill -9 of the manager, then of the source,
//! then of the target, each at a randomly chosen state of a live move under
//! write load. No acknowledged write is lost, and every move ends DONE or
//! ABORTED (never stuck) within a bound.
//!
//! Real processes: `keyway meta`, three `keyway server`s and a `keyway
//! manager`, each logging at `info` into the test's temp dir (the tails are
//! printed, and the dir kept, if the test fails). One partition (the "hot"
//! one) is preloaded with ~30 MB and moved three times around the nodes while
//! load threads write new keys `load:N` everywhere (half of them into the hot
//! partition) and overwrite or delete some they wrote before; at the end
//! every key whose last write was acknowledged must read as that write left
//! it. The copy is throttled so COPYING lasts a few seconds. The
//! seed is printed; `KEYWAY_TEST_SEED=N` replays the same choices, and
//! `KEYWAY_TEST_KEEP=1` keeps the logs and data even when the test passes.

mod common;

use bytes::{Bytes, BytesMut};
use common::free_port_block;
use keyway_map::{DEFAULT_KEYSPACE, NodeId, NodeState, PartitionId, PartitionMap, key_hash_slot};
use keyway_meta::MetaStore;
use keyway_migration::{MigrationRecord, MigrationState};
use keyway_resp::{Frame, Limits, Protocol, ResponseParser, encode};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashMap};
use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

const LOG_FILTER: &str = "info,fjall=warn,lsm_tree=warn,h2=warn,tower=warn,hyper=warn";
const LEASE_TTL_MS: u64 = 2000;
const STUCK_TIMEOUT_MS: u64 = 10_000;
const FENCE_TIMEOUT_MS: u64 = 3_000;
const CLEANUP_GRACE_MS: u64 = 500;
/// Copy cap: ~30 MB of preload copies in about four seconds.
const COPY_BYTES_PER_SEC: u64 = 8_000_000;
const PRELOAD_KEYS: usize = 30_000;
const PRELOAD_VALUE_LEN: usize = 1024;
/// How long a move may take to end after the kill: the stuck timeout (no
/// progress → abort), plus a fence timeout, plus two lease TTLs (a dead
/// manager's seat, a restarted node's lease), plus slack for restarts on a
/// busy machine.
const TERMINAL_BOUND: Duration =
    Duration::from_millis(STUCK_TIMEOUT_MS + FENCE_TIMEOUT_MS + 2 * LEASE_TTL_MS + 15_000);
const WAIT: Duration = Duration::from_secs(30);
/// How long a client follows `-MOVED` redirects for one request.
const REDIRECT_PATIENCE: Duration = Duration::from_secs(2);
const LOAD_THREADS_ANY: usize = 2;
const LOAD_THREADS_HOT: usize = 2;
/// A load thread's pause between writes (keeps the number of keys to verify modest).
const LOAD_PAUSE: Duration = Duration::from_micros(500);

/// The states a victim may be killed in, in protocol order.
const KILL_STATES: [MigrationState; 5] = [
    MigrationState::Copying,
    MigrationState::Catchup,
    MigrationState::Dual,
    MigrationState::Cutover,
    MigrationState::Cleanup,
];

fn order(s: MigrationState) -> usize {
    MigrationState::ALL.iter().position(|x| *x == s).unwrap()
}

// ---------------------------------------------------------------- processes

/// A `keyway` process that can be killed -9 and restarted with the same args.
/// stdout lines go to a channel; stderr (the log) is appended to `log`.
struct Daemon {
    label: String,
    args: Vec<String>,
    ready: &'static str,
    log: PathBuf,
    child: Option<Child>,
    lines: Option<mpsc::Receiver<String>>,
    incarnation: u32,
}

impl Daemon {
    fn start(label: &str, args: Vec<String>, ready: &'static str, logs: &Path) -> Daemon {
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
    fn wait_line(&self, text: &str, within: Duration) -> String {
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

    fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.lines = None;
    }

    fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    /// Panics if the process exited on its own (a crash, a panic).
    fn assert_alive(&mut self) {
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

struct Cluster {
    meta: Daemon,
    servers: Vec<Daemon>,
    manager: Daemon,
    meta_url: String,
    ports: Vec<u16>,
    logs: PathBuf,
    dir: Option<tempfile::TempDir>,
}

impl Cluster {
    fn start() -> Cluster {
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

    fn ctl(&self, args: &[&str]) -> String {
        let out = Command::new(env!("CARGO_BIN_EXE_keyway"))
            .args(["ctl", "--meta", &self.meta_url])
            .args(args)
            .env("KEYWAY_LOG", "warn")
            .output()
            .expect("run keyway ctl");
        assert!(
            out.status.success(),
            "keyway ctl {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn server_index(&self, map: &PartitionMap, node: NodeId) -> usize {
        let addr = &map.nodes[&node].resp_addr;
        self.ports
            .iter()
            .position(|p| *addr == format!("127.0.0.1:{p}"))
            .unwrap_or_else(|| panic!("node {node} at {addr} is none of ours"))
    }

    fn assert_all_alive(&mut self) {
        self.meta.assert_alive();
        self.manager.assert_alive();
        for s in &mut self.servers {
            s.assert_alive();
        }
    }

    /// Every node answers `cluster_state:ok`.
    fn wait_cluster_ok(&self, within: Duration) {
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
            for d in std::iter::once(&self.meta)
                .chain(self.servers.iter())
                .chain(std::iter::once(&self.manager))
            {
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

// ---------------------------------------------------------------- RESP client

/// A blocking RESP connection that reports failures instead of panicking.
struct Conn {
    stream: TcpStream,
    buf: BytesMut,
    parser: ResponseParser,
}

impl Conn {
    fn connect(port: u16) -> std::io::Result<Conn> {
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        stream.set_nodelay(true)?;
        // Longer than a node's longest hold behind a fence (30 s).
        stream.set_read_timeout(Some(Duration::from_secs(40)))?;
        Ok(Conn {
            stream,
            buf: BytesMut::new(),
            parser: ResponseParser::new(Limits::default()),
        })
    }

    fn encode(args: &[&[u8]], out: &mut BytesMut) {
        let frame = Frame::Array(
            args.iter()
                .map(|a| Frame::Bulk(Bytes::copy_from_slice(a)))
                .collect(),
        );
        encode(&frame, Protocol::Resp2, out);
    }

    fn request(&mut self, args: &[&[u8]]) -> std::io::Result<Frame> {
        let mut out = BytesMut::new();
        Self::encode(args, &mut out);
        self.stream.write_all(&out)?;
        self.read_reply()
    }

    /// Sends every request, then reads as many replies.
    fn pipeline(&mut self, reqs: &[Vec<Vec<u8>>]) -> std::io::Result<Vec<Frame>> {
        let mut out = BytesMut::new();
        for r in reqs {
            let args: Vec<&[u8]> = r.iter().map(|a| a.as_slice()).collect();
            Self::encode(&args, &mut out);
        }
        self.stream.write_all(&out)?;
        (0..reqs.len()).map(|_| self.read_reply()).collect()
    }

    fn read_reply(&mut self) -> std::io::Result<Frame> {
        loop {
            if let Some(frame) = self
                .parser
                .parse(&mut self.buf)
                .map_err(|e| std::io::Error::other(e.to_string()))?
            {
                return Ok(frame);
            }
            let mut chunk = [0u8; 64 * 1024];
            let n = self.stream.read(&mut chunk)?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

/// The port of `-MOVED slot host:port`.
fn moved_port(e: &str) -> Option<u16> {
    let rest = e.strip_prefix("MOVED ")?;
    rest.rsplit(':').next()?.parse().ok()
}

/// A slot → port table (learned from the map, fixed by `-MOVED`) and one
/// connection per port.
struct Router {
    routes: Vec<u16>,
    conns: HashMap<u16, Conn>,
    /// Redirect chains of two hops or more (bounces), for the report.
    redirect_chains: Vec<String>,
    /// RESP port → admin port of every node (to snapshot their maps).
    admin_of: BTreeMap<u16, u16>,
}

impl Router {
    fn new(map: &PartitionMap) -> Router {
        let admin_of = map
            .nodes
            .values()
            .map(|n| {
                let port = |addr: &str| addr.rsplit(':').next().unwrap().parse::<u16>().unwrap();
                (port(&n.resp_addr), port(&n.admin_addr))
            })
            .collect();
        let routes = (0..keyway_map::SLOT_COUNT)
            .map(|slot| {
                let p = map.locate_slot(DEFAULT_KEYSPACE, slot).unwrap();
                map.nodes[&p.owner].resp_host_port().1
            })
            .collect();
        Router {
            routes,
            conns: HashMap::new(),
            redirect_chains: Vec::new(),
            admin_of,
        }
    }

    fn conn(&mut self, port: u16) -> std::io::Result<&mut Conn> {
        match self.conns.entry(port) {
            std::collections::hash_map::Entry::Occupied(e) => Ok(e.into_mut()),
            std::collections::hash_map::Entry::Vacant(e) => Ok(e.insert(Conn::connect(port)?)),
        }
    }

    /// Sends one request for `key`, following `-MOVED`s (a few at once,
    /// then with growing pauses, as cluster clients do, for about two
    /// seconds). An I/O error drops the connection. A redirect chain of
    /// two hops or more (a bounce between nodes whose maps disagree) is
    /// noted in `redirect_chains`, resolved or not.
    fn request(&mut self, key: &str, args: &[&[u8]]) -> std::io::Result<Frame> {
        let slot = key_hash_slot(key.as_bytes()) as usize;
        let started = Instant::now();
        let mut chain: Vec<String> = Vec::new();
        let mut hop = 0u64;
        let reply = loop {
            let port = self.routes[slot];
            let reply = self.conn(port).and_then(|c| c.request(args));
            match &reply {
                Err(e) => {
                    self.conns.remove(&port);
                    chain.push(format!("{port}: {e}"));
                    break reply;
                }
                Ok(Frame::Error(e)) if e.starts_with("MOVED ") => {
                    chain.push(format!("{port}: {e}"));
                    self.routes[slot] = moved_port(e).expect("a MOVED names a port");
                    hop += 1;
                    if started.elapsed() > REDIRECT_PATIENCE {
                        break reply;
                    }
                    if hop >= 3 {
                        std::thread::sleep(Duration::from_millis((10 * hop).min(200)));
                    }
                }
                Ok(other) => {
                    chain.push(format!("{port}: {other:?}"));
                    break reply;
                }
            }
        };
        if hop >= 2 {
            let unresolved = matches!(&reply, Ok(Frame::Error(e)) if e.starts_with("MOVED "));
            let views = if unresolved {
                format!(" [UNRESOLVED; nodes' views: {}]", self.views(slot as u16))
            } else {
                String::new()
            };
            self.redirect_chains.push(format!(
                "{} {key}: {} hops in {:?}: {}{views}",
                wall_clock(),
                hop,
                started.elapsed(),
                chain.join(" -> ")
            ));
        }
        reply
    }

    /// What every node's `/map` and `/status` say about `slot`'s partition now.
    fn views(&self, slot: u16) -> String {
        self.admin_of
            .iter()
            .map(|(resp, admin)| {
                let map = http_get(*admin, "/map").and_then(|body| {
                    let mut map: PartitionMap = serde_json::from_str(&body).ok()?;
                    map.reindex();
                    let p = map.locate_slot(DEFAULT_KEYSPACE, slot)?.clone();
                    Some(format!(
                        "map v{} partition {} owner {} epoch {}",
                        map.version.0, p.id, p.owner, p.epoch
                    ))
                });
                let status = http_get(*admin, "/status");
                format!(
                    "{resp}: {} status {}",
                    map.unwrap_or_else(|| "no map".into()),
                    status.unwrap_or_else(|| "none".into())
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// A plain HTTP/1.1 GET; the body, or `None` if nothing answers.
fn http_get(port: u16, path: &str) -> Option<String> {
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
    let (_, body) = response.split_once("\r\n\r\n")?;
    Some(body.to_string())
}

/// Now as `HH:MM:SS.mmm` UTC, to line up with the processes' logs.
fn wall_clock() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let s = ms / 1000;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        (s / 3600) % 24,
        (s / 60) % 60,
        s % 60,
        ms % 1000
    )
}

// ---------------------------------------------------------------- load

fn load_value(n: u64, version: u32) -> String {
    format!("value-of-load-{n}-v{version}-{}", "v".repeat(40))
}

/// What a key must read as at the end, per the acknowledged writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Want {
    Value(u32),
    Absent,
}

#[derive(Default)]
struct LoadStats {
    /// Keys whose last write was acknowledged (an unknown outcome removes a key).
    want: HashMap<u64, Want>,
    acked_sets: u64,
    acked_overwrites: u64,
    acked_dels: u64,
    unknown: u64,
    errors: BTreeMap<String, u64>,
    /// Live evidence of a lost write: a DEL of a key known to exist said 0.
    anomalies: Vec<String>,
    /// The router's redirect chains of two hops or more.
    redirect_chains: Vec<String>,
}

/// An error text with its numbers blanked, to count errors by kind.
fn error_kind(e: &str) -> String {
    e.chars()
        .map(|c| if c.is_ascii_digit() { '#' } else { c })
        .collect()
}

/// Writes until `stop`: mostly new keys `load:N` (N from the shared
/// counter), sometimes an overwrite or a DEL of a key this thread wrote
/// before. With `hot`, only keys whose slot is in `hot` (other N are skipped,
/// not written). A write counts only on its success reply; any other outcome
/// (error, dead connection) leaves the key uncertain and it is not checked.
fn load_thread(
    map: PartitionMap,
    counter: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    hot: Option<(u16, u16)>,
    seed: u64,
) -> LoadStats {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut router = Router::new(&map);
    let mut stats = LoadStats::default();
    // Keys this thread may overwrite or delete (their last write acknowledged, present).
    let mut present: Vec<u64> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let roll = rng.random_range(0..100);
        let (n, new_want, key) = if roll < 15 && !present.is_empty() {
            let i = rng.random_range(0..present.len());
            let n = present.swap_remove(i);
            let want = match stats.want[&n] {
                Want::Value(v) if roll < 10 => Want::Value(v + 1),
                _ => Want::Absent,
            };
            (n, want, format!("load:{n}"))
        } else {
            let n = counter.fetch_add(1, Ordering::Relaxed);
            let key = format!("load:{n}");
            if let Some((first, last)) = hot {
                let slot = key_hash_slot(key.as_bytes());
                if slot < first || slot > last {
                    continue;
                }
            }
            (n, Want::Value(0), key)
        };
        let reply = match new_want {
            Want::Value(v) => {
                let value = load_value(n, v);
                router.request(&key, &[b"SET", key.as_bytes(), value.as_bytes()])
            }
            Want::Absent => router.request(&key, &[b"DEL", key.as_bytes()]),
        };
        match reply {
            Ok(Frame::Simple(s)) if s == "OK" && new_want != Want::Absent => {
                if new_want == Want::Value(0) {
                    stats.acked_sets += 1;
                } else {
                    stats.acked_overwrites += 1;
                }
                stats.want.insert(n, new_want);
                present.push(n);
            }
            Ok(Frame::Integer(deleted)) if new_want == Want::Absent => {
                stats.acked_dels += 1;
                if deleted != 1 {
                    stats.anomalies.push(format!(
                        "DEL {key} answered {deleted}, but its last acknowledged write was {:?}",
                        stats.want[&n]
                    ));
                }
                stats.want.insert(n, Want::Absent);
            }
            Ok(Frame::Error(e)) => {
                stats.unknown += 1;
                stats.want.remove(&n);
                *stats.errors.entry(error_kind(&e)).or_default() += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(other) => panic!("{new_want:?} on {key}: unexpected reply {other:?}"),
            Err(e) => {
                stats.unknown += 1;
                stats.want.remove(&n);
                *stats
                    .errors
                    .entry(format!("io: {:?}", e.kind()))
                    .or_default() += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        std::thread::sleep(LOAD_PAUSE);
    }
    stats.redirect_chains = router.redirect_chains;
    stats
}

// ---------------------------------------------------------------- helpers

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn get_map(rt: &tokio::runtime::Runtime, meta: &Arc<dyn MetaStore>) -> PartitionMap {
    let deadline = Instant::now() + WAIT;
    loop {
        match rt.block_on(meta.get_map()) {
            Ok(map) if !map.partitions.is_empty() => return map,
            Ok(_) => {}
            Err(e) => assert!(Instant::now() < deadline, "get_map: {e}"),
        }
        assert!(Instant::now() < deadline, "no map");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn migration(rt: &tokio::runtime::Runtime, meta: &Arc<dyn MetaStore>, id: u64) -> MigrationRecord {
    let stored = rt
        .block_on(meta.get_migration(id))
        .expect("get_migration")
        .unwrap_or_else(|| panic!("migration {id} vanished"));
    MigrationRecord::decode(&stored.record).expect("decode migration")
}

/// Writes `PRELOAD_KEYS` keys of `PRELOAD_VALUE_LEN` bytes into `partition`
/// (pipelined at its owner); returns their names.
fn preload(map: &PartitionMap, partition: PartitionId) -> Vec<String> {
    let p = &map.partitions[&partition];
    let port = map.nodes[&p.owner].resp_host_port().1;
    let (first, last) = p.slot_span();
    let keys: Vec<String> = (0u64..)
        .map(|i| format!("pre:{i}"))
        .filter(|k| {
            let s = key_hash_slot(k.as_bytes());
            s >= first && s <= last
        })
        .take(PRELOAD_KEYS)
        .collect();
    let value = vec![b'p'; PRELOAD_VALUE_LEN];
    let mut c = Conn::connect(port).unwrap();
    for batch in keys.chunks(500) {
        let reqs: Vec<Vec<Vec<u8>>> = batch
            .iter()
            .map(|k| vec![b"SET".to_vec(), k.as_bytes().to_vec(), value.clone()])
            .collect();
        for (k, r) in batch.iter().zip(c.pipeline(&reqs).unwrap()) {
            assert_eq!(r, Frame::Simple("OK".into()), "preload SET {k}");
        }
    }
    keys
}

/// GETs every key (pipelined per owner, following `-MOVED` one by one);
/// returns the keys whose value is missing or wrong (or present though
/// deleted), with what was read.
fn verify(
    map: &PartitionMap,
    expect: &[(String, Option<Vec<u8>>)],
) -> (Vec<(String, Frame)>, Vec<String>) {
    let mut router = Router::new(map);
    let mut by_port: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
    for (i, (k, _)) in expect.iter().enumerate() {
        let port = router.routes[key_hash_slot(k.as_bytes()) as usize];
        by_port.entry(port).or_default().push(i);
    }
    let mut bad = Vec::new();
    for (port, idx) in by_port {
        for batch in idx.chunks(1000) {
            let reqs: Vec<Vec<Vec<u8>>> = batch
                .iter()
                .map(|i| vec![b"GET".to_vec(), expect[*i].0.as_bytes().to_vec()])
                .collect();
            let replies = router
                .conn(port)
                .and_then(|c| c.pipeline(&reqs))
                .unwrap_or_else(|e| panic!("verify at {port}: {e}"));
            for (i, reply) in batch.iter().zip(replies) {
                let (key, want) = &expect[*i];
                let reply = match reply {
                    Frame::Error(e) if e.starts_with("MOVED ") => router
                        .request(key, &[b"GET", key.as_bytes()])
                        .unwrap_or_else(|e| panic!("verify GET {key}: {e}")),
                    other => other,
                };
                let wanted = match want {
                    Some(v) => Frame::Bulk(Bytes::copy_from_slice(v)),
                    None => Frame::Null,
                };
                if reply != wanted {
                    bad.push((key.clone(), reply));
                }
            }
        }
    }
    (bad, router.redirect_chains)
}

/// Every partition is owned by one of our (live) nodes, and every slot is covered.
fn assert_map_sane(map: &PartitionMap, ours: &[NodeId]) {
    for p in map.partitions.values() {
        assert!(
            ours.contains(&p.owner),
            "partition {} owned by {} which is not a live node",
            p.id,
            p.owner
        );
        assert_eq!(
            map.nodes[&p.owner].state,
            NodeState::Up,
            "partition {} owner {} is not up",
            p.id,
            p.owner
        );
    }
    for slot in 0..keyway_map::SLOT_COUNT {
        assert!(
            map.locate_slot(DEFAULT_KEYSPACE, slot).is_some(),
            "slot {slot} has no partition"
        );
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Victim {
    Manager,
    Source,
    Target,
}

struct Round {
    victim: Victim,
    wanted: MigrationState,
    killed_in: MigrationState,
    outcome: MigrationState,
    abort_reason: Option<String>,
    kill_to_end: Duration,
    move_took: Duration,
}

// ---------------------------------------------------------------- the test

#[test]
fn kill_9_of_manager_source_or_target_mid_move_loses_no_acknowledged_write() {
    let seed: u64 = std::env::var("KEYWAY_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("seed {seed} (KEYWAY_TEST_SEED={seed} replays the choices)");
    let mut rng = StdRng::seed_from_u64(seed);
    let started = Instant::now();

    let mut cluster = Cluster::start();
    eprintln!(
        "cluster up in {:?}; logs in {}",
        started.elapsed(),
        cluster.logs.display()
    );
    cluster.manager.wait_line("manager mgr leading", WAIT);
    cluster.wait_cluster_ok(WAIT);
    let rt = runtime();
    let meta = rt
        .block_on(keyway_meta::connect(&cluster.meta_url))
        .unwrap();
    let map = get_map(&rt, &meta);
    let ours: Vec<NodeId> = map.nodes.keys().copied().collect();
    assert_eq!(ours.len(), 3);

    // The hot partition: chosen at random, moved in every round.
    let pids: Vec<PartitionId> = map.partitions.keys().copied().collect();
    let hot = pids[rng.random_range(0..pids.len())];
    let hot_span = map.partitions[&hot].slot_span();
    let t = Instant::now();
    let preloaded = preload(&map, hot);
    eprintln!(
        "preloaded partition {hot} (slots {}-{}) with {} keys of {} bytes in {:?}",
        hot_span.0,
        hot_span.1,
        preloaded.len(),
        PRELOAD_VALUE_LEN,
        t.elapsed()
    );

    // The load.
    let counter = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let loaders: Vec<_> = (0..LOAD_THREADS_ANY + LOAD_THREADS_HOT)
        .map(|i| {
            let (map, counter, stop) = (map.clone(), counter.clone(), stop.clone());
            let hot = (i >= LOAD_THREADS_ANY).then_some(hot_span);
            let seed = seed.wrapping_add(1 + i as u64);
            std::thread::spawn(move || load_thread(map, counter, stop, hot, seed))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));

    let mut rounds = Vec::new();
    for victim in [Victim::Manager, Victim::Source, Victim::Target] {
        cluster.assert_all_alive();
        let map = get_map(&rt, &meta);
        let source = map.partitions[&hot].owner;
        let others: Vec<NodeId> = ours.iter().copied().filter(|n| *n != source).collect();
        let target = others[rng.random_range(0..others.len())];
        let wanted = KILL_STATES[rng.random_range(0..KILL_STATES.len())];
        let (si, ti) = (
            cluster.server_index(&map, source),
            cluster.server_index(&map, target),
        );
        let out = cluster.ctl(&[
            "--json",
            "move",
            &hot.to_string(),
            "--to",
            &format!("127.0.0.1:{}", cluster.ports[ti]),
            "--detach",
        ]);
        let ids: Vec<u64> = serde_json::from_str(&out).expect("move --json prints ids");
        assert_eq!(ids.len(), 1, "{out}");
        let id = ids[0];
        let requested = Instant::now();
        eprintln!(
            "round {victim:?}: migration {id} partition {hot} server{si} -> server{ti}; kill the {victim:?} in {wanted}"
        );

        // Wait for the chosen state (or any later one).
        let mut seen = Vec::new();
        let killed_in = loop {
            let rec = migration(&rt, &meta, id);
            if seen.last() != Some(&rec.state) {
                seen.push(rec.state);
            }
            if order(rec.state) >= order(wanted) || rec.state.is_terminal() {
                break rec.state;
            }
            assert!(
                requested.elapsed() < TERMINAL_BOUND,
                "migration {id} never reached {wanted}: states seen {seen:?}"
            );
            std::thread::sleep(Duration::from_millis(2));
        };
        let daemon = match victim {
            Victim::Manager => &mut cluster.manager,
            Victim::Source => &mut cluster.servers[si],
            Victim::Target => &mut cluster.servers[ti],
        };
        daemon.kill9();
        let killed = Instant::now();
        let just_after = migration(&rt, &meta, id).state;
        eprintln!(
            "round {victim:?}: killed {} in {killed_in} (record in {just_after} right after; {:?} after the request; states seen {seen:?})",
            daemon.label,
            killed.duration_since(requested)
        );
        daemon.restart();
        eprintln!(
            "round {victim:?}: {} restarted in {:?}",
            daemon.label,
            killed.elapsed()
        );

        // The move must end, one way or the other.
        let rec = loop {
            let rec = migration(&rt, &meta, id);
            if seen.last() != Some(&rec.state) {
                seen.push(rec.state);
            }
            if rec.state.is_terminal() {
                break rec;
            }
            assert!(
                killed.elapsed() < TERMINAL_BOUND,
                "round {victim:?}: migration {id} stuck in {} {:?} after the kill (killed in {killed_in}; states seen {seen:?}; record {rec:?})",
                rec.state,
                killed.elapsed()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let round = Round {
            victim,
            wanted,
            killed_in,
            outcome: rec.state,
            abort_reason: rec.abort_reason.as_ref().map(|r| format!("{r:?}")),
            kill_to_end: killed.elapsed(),
            move_took: requested.elapsed(),
        };
        eprintln!(
            "round {victim:?}: migration {id} {} ({}) {:?} after the kill, {:?} after the request; states seen {seen:?}; pause {:?} ms",
            round.outcome,
            round.abort_reason.as_deref().unwrap_or("-"),
            round.kill_to_end,
            round.move_took,
            rec.pause_ms
        );
        // The map agrees with the outcome.
        let map = get_map(&rt, &meta);
        let owner = map.partitions[&hot].owner;
        match rec.state {
            MigrationState::Done => assert_eq!(owner, target, "DONE: the target owns it"),
            _ => assert_eq!(owner, source, "ABORTED: the source still owns it"),
        }
        assert_map_sane(&map, &ours);
        cluster.wait_cluster_ok(WAIT);
        rounds.push(round);
        std::thread::sleep(Duration::from_millis(300));
    }

    // Stop the load and check every acknowledged write.
    stop.store(true, Ordering::Relaxed);
    let mut want: Vec<(u64, Want)> = Vec::new();
    let (mut sets, mut overwrites, mut dels, mut unknown) = (0, 0, 0, 0);
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    let mut anomalies = Vec::new();
    let mut redirect_chains = Vec::new();
    for l in loaders {
        let s = l.join().expect("load thread");
        want.extend(s.want);
        sets += s.acked_sets;
        overwrites += s.acked_overwrites;
        dels += s.acked_dels;
        unknown += s.unknown;
        anomalies.extend(s.anomalies);
        redirect_chains.extend(s.redirect_chains);
        for (k, v) in s.errors {
            *errors.entry(k).or_default() += v;
        }
    }
    cluster.assert_all_alive();
    let map = get_map(&rt, &meta);
    assert_map_sane(&map, &ours);
    let in_hot = |key: &str| {
        let s = key_hash_slot(key.as_bytes());
        s >= hot_span.0 && s <= hot_span.1
    };
    let mut expect: Vec<(String, Option<Vec<u8>>)> = want
        .iter()
        .map(|(n, w)| {
            let value = match w {
                Want::Value(v) => Some(load_value(*n, *v).into_bytes()),
                Want::Absent => None,
            };
            (format!("load:{n}"), value)
        })
        .collect();
    let hot_keys = expect.iter().filter(|(k, _)| in_hot(k)).count();
    let deleted = expect.iter().filter(|(_, v)| v.is_none()).count();
    expect.extend(
        preloaded
            .iter()
            .map(|k| (k.clone(), Some(vec![b'p'; PRELOAD_VALUE_LEN]))),
    );
    let t = Instant::now();
    let (bad, verify_chains) = verify(&map, &expect);
    eprintln!(
        "load: acknowledged {sets} new keys, {overwrites} overwrites, {dels} deletes; {unknown} outcomes unknown (errors {errors:?})"
    );
    eprintln!(
        "verify: {} keys checked ({} of the load, {hot_keys} of them in the moving partition, {deleted} deleted; {} preloaded) in {:?}: {} lost or wrong",
        expect.len(),
        want.len(),
        preloaded.len(),
        t.elapsed(),
        bad.len()
    );
    let unresolved = redirect_chains
        .iter()
        .filter(|c| {
            c.rsplit(" -> ")
                .next()
                .is_some_and(|last| last.contains("MOVED"))
        })
        .count();
    eprintln!(
        "redirect chains of two hops or more: {} during the load ({unresolved} unresolved after {REDIRECT_PATIENCE:?}), {} during the verification",
        redirect_chains.len(),
        verify_chains.len()
    );
    let mut chains: Vec<&String> = redirect_chains.iter().chain(&verify_chains).collect();
    chains.sort_by_key(|c| !c.contains("UNRESOLVED"));
    for c in chains.iter().take(20) {
        eprintln!("  {c}");
    }
    assert_eq!(
        unresolved, 0,
        "requests bounced between nodes for more than {REDIRECT_PATIENCE:?} (see the chains above)"
    );
    assert!(
        anomalies.is_empty(),
        "{} DELs found acknowledged keys missing, e.g. {:?}",
        anomalies.len(),
        &anomalies[..anomalies.len().min(10)]
    );
    assert!(
        bad.is_empty(),
        "{} acknowledged writes lost or wrong, e.g. {:?}",
        bad.len(),
        &bad[..bad.len().min(10)]
    );
    assert!(hot_keys > 1000, "too few writes hit the moving partition");

    // `ctl map --json` agrees: every partition owned by a node of ours that is up.
    let json: serde_json::Value = serde_json::from_str(&cluster.ctl(&["--json", "map"])).unwrap();
    let nodes = json["nodes"].as_object().expect("nodes object");
    let parts = json["partitions"].as_object().expect("partitions object");
    assert_eq!(parts.len(), map.partitions.len());
    for (id, p) in parts {
        let owner = &p["owner"];
        let node = nodes
            .values()
            .find(|n| &n["id"] == owner)
            .unwrap_or_else(|| panic!("ctl map: partition {id} owned by unknown node {owner}"));
        assert!(
            ours.iter().any(|o| serde_json::json!(o) == *owner),
            "ctl map: partition {id} owned by {owner}, not one of our nodes"
        );
        assert_eq!(node["state"], "up", "ctl map: partition {id} owner {node}");
    }
    // And every owner holds a live lease.
    let leased: Vec<NodeId> = rt
        .block_on(meta.leases())
        .expect("leases")
        .into_iter()
        .map(|l| l.node)
        .collect();
    for p in map.partitions.values() {
        assert!(
            leased.contains(&p.owner),
            "partition {} owner {} holds no lease (leases: {leased:?})",
            p.id,
            p.owner
        );
    }
    let migrations: serde_json::Value =
        serde_json::from_str(&cluster.ctl(&["--json", "migrations"])).unwrap();
    for m in migrations.as_array().unwrap() {
        let state = m["state"].as_str().unwrap();
        assert!(state == "DONE" || state == "ABORTED", "ctl migrations: {m}");
    }

    // No process panicked (a panic in a task need not kill the process).
    for d in std::iter::once(&cluster.meta)
        .chain(cluster.servers.iter())
        .chain(std::iter::once(&cluster.manager))
    {
        let log = std::fs::read_to_string(&d.log).unwrap_or_default();
        assert!(
            !log.contains("panicked"),
            "{} logged a panic (see {})",
            d.label,
            d.log.display()
        );
    }

    eprintln!("summary (seed {seed}):");
    for r in &rounds {
        eprintln!(
            "  kill {:?}: wanted {}, killed in {}, outcome {} ({}), ended {:?} after the kill, move took {:?}",
            r.victim,
            r.wanted,
            r.killed_in,
            r.outcome,
            r.abort_reason.as_deref().unwrap_or("-"),
            r.kill_to_end,
            r.move_took
        );
    }
    eprintln!("total {:?}", started.elapsed());
}
