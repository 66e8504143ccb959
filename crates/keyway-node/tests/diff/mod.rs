//! The differential-test harness shared by `cmd_redis_diff.rs` and the
//! per-family `diff_*.rs` tests: a private `redis-server` (free loopback
//! port, `--save ""`), Keyway's data commands in-process over a
//! `MemEngine`, reply normalisation for commands whose order or choice Redis
//! leaves open, and a proptest runner that replays random command sequences
//! on both, compares every reply and the final state of every key, and
//! prints the shrunk counterexample on a mismatch.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use keyway_map::{DEFAULT_KEYSPACE, Keyspace, Routing};
use keyway_node::cmd;
use keyway_node::db::{Db, DbLimits};
use keyway_resp::{Frame, Limits, Protocol, ResponseParser, encode, encode_command};
use keyway_storage::{Engine, MemEngine};
use proptest::strategy::Strategy;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};

pub struct Redis {
    child: Child,
    conn: TcpStream,
    buf: BytesMut,
    parser: ResponseParser,
    /// The cluster-mode server's directory (its `nodes.conf`).
    _dir: Option<tempfile::TempDir>,
    /// Where redis-server logs, named when the connection to it fails.
    log: std::path::PathBuf,
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Kept after a failure, for the panic message that names it.
        if !std::thread::panicking() {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}

impl Redis {
    pub fn start() -> Option<Redis> {
        Redis::spawn(&[], None)
    }

    /// A one-node Redis Cluster owning every slot, for commands whose
    /// replies differ in cluster mode (SORT's BY/GET, COPY's DB): Keyway
    /// always answers as a cluster node.
    pub fn start_cluster() -> Option<Redis> {
        let dir = tempfile::tempdir().ok()?;
        let path = dir.path().to_str()?.to_owned();
        let mut redis = Redis::spawn(
            &[
                "--cluster-enabled",
                "yes",
                "--dir",
                &path,
                "--cluster-config-file",
                "nodes.conf",
            ],
            Some(dir),
        )?;
        redis.call(&[
            Bytes::from_static(b"CLUSTER"),
            Bytes::from_static(b"ADDSLOTSRANGE"),
            Bytes::from_static(b"0"),
            Bytes::from_static(b"16383"),
        ]);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let info = redis.call(&[Bytes::from_static(b"CLUSTER"), Bytes::from_static(b"INFO")]);
            if info
                .as_bytes()
                .is_some_and(|t| String::from_utf8_lossy(t).contains("cluster_state:ok"))
            {
                return Some(redis);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn spawn(extra: &[&str], dir: Option<tempfile::TempDir>) -> Option<Redis> {
        // Below the ephemeral range: a port that `bind(0)` handed out and
        // released could be given to another test's outgoing connection
        // before redis-server binds it (the full suite once saw the
        // reference connection reset mid-test).
        let port = keyway_testkit::free_port_block(1);
        let log = std::env::temp_dir().join(format!("keyway-diff-redis-{port}.log"));
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args(extra)
            .arg("--logfile")
            .arg(&log)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut child = Some(child);
        loop {
            // Connected only once a PING is answered: something else may
            // listen on the port for a moment before redis-server binds it
            // (another process's free-port check binds and drops ports),
            // and a connection accepted there is reset at the first write
            // (the full suite saw "write to redis: Connection reset by
            // peer" on a fresh connection, with a clean redis log).
            if let Ok(mut conn) = TcpStream::connect(("127.0.0.1", port))
                && conn.set_read_timeout(Some(Duration::from_secs(10))).is_ok()
                && answers_ping(&mut conn)
            {
                return Some(Redis {
                    child: child.take()?,
                    conn,
                    buf: BytesMut::new(),
                    parser: ResponseParser::new(Limits::default()),
                    _dir: dir,
                    log,
                });
            }
            if Instant::now() > deadline {
                let mut c = child.take()?;
                let _ = c.kill();
                let _ = c.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn call(&mut self, args: &[Bytes]) -> Frame {
        let mut out = BytesMut::new();
        encode_command(args, &mut out);
        let log = self.log.display();
        self.conn
            .write_all(&out)
            .unwrap_or_else(|e| panic!("write to redis: {e} (its log: {log})"));
        loop {
            if let Some(frame) = self.parser.parse(&mut self.buf).expect("redis reply") {
                return frame;
            }
            let mut chunk = [0u8; 16384];
            let n = self
                .conn
                .read(&mut chunk)
                .unwrap_or_else(|e| panic!("read from redis: {e} (its log: {log})"));
            assert!(n > 0, "redis closed the connection (its log: {log})");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

/// Whether `conn` answers `PING` with `+PONG` (the whole reply in one read).
fn answers_ping(conn: &mut TcpStream) -> bool {
    let mut reply = [0u8; 7];
    conn.write_all(b"*1\r\n$4\r\nPING\r\n").is_ok()
        && conn.read_exact(&mut reply).is_ok()
        && &reply == b"+PONG\r\n"
}

pub struct Keyway {
    engine: MemEngine,
    ks: Keyspace,
    limits: DbLimits,
    scripts: keyway_node::script::Scripts,
}

impl Keyway {
    pub fn new() -> Self {
        Keyway {
            engine: MemEngine::new(),
            ks: Keyspace {
                id: DEFAULT_KEYSPACE,
                name: "default".into(),
                routing: Routing::Hash,
                replication_factor: 1,
                min_in_sync: 1,
            },
            limits: DbLimits::default(),
            scripts: keyway_node::script::Scripts::new(&keyway_node::metrics::Metrics::default()),
        }
    }

    pub fn call(&self, args: &[Bytes], proto: Protocol) -> Frame {
        let frame = if args
            .first()
            .is_some_and(|a| a.eq_ignore_ascii_case(b"command"))
        {
            cmd::table::command_reply(&args[1..])
        } else if args
            .first()
            .is_some_and(|a| a.eq_ignore_ascii_case(b"script"))
        {
            keyway_node::script::script_command_on(&self.scripts, args)
        } else if let Some(name) = args
            .first()
            .map(|a| String::from_utf8_lossy(a).to_ascii_uppercase())
            .filter(|n| keyway_node::script::is_eval(n))
        {
            match keyway_node::script::Eval::parse(&self.scripts, &name, args) {
                Err(f) => f,
                Ok(eval) => {
                    let mut db = Db::new(&self.engine, &self.ks, now_ms(), &self.limits);
                    let reply = eval.run(&mut db, &self.scripts, 0, None).expect("storage");
                    self.engine.apply(&db.into_mutations()).expect("apply");
                    reply
                }
            }
        } else {
            match cmd::parse(args) {
                None => panic!("not a data command: {args:?}"),
                Some(Err(f)) => f,
                Some(Ok(c)) => {
                    let mut db = Db::new(&self.engine, &self.ks, now_ms(), &self.limits);
                    let reply = c.execute(&mut db).expect("storage");
                    self.engine.apply(&db.into_mutations()).expect("apply");
                    reply
                }
            }
        };
        // Round-trip through the wire format, as a client would see it.
        let mut wire = BytesMut::new();
        encode(&frame, proto, &mut wire);
        ResponseParser::new(Limits::default())
            .parse(&mut wire)
            .expect("own reply parses")
            .expect("complete")
    }
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

pub fn tokenize(line: &str) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut chars = line.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c == ' ' {
            chars.next();
            continue;
        }
        let mut tok = String::new();
        if c == '"' {
            chars.next();
            for c in chars.by_ref() {
                if c == '"' {
                    break;
                }
                tok.push(c);
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c == ' ' {
                    break;
                }
                tok.push(c);
                chars.next();
            }
        }
        out.push(Bytes::from(substitute(&tok)));
    }
    out
}

pub fn substitute(tok: &str) -> String {
    for (prefix, base) in [("$NOWMS", now_ms()), ("$NOWS", now_ms() / 1000)] {
        if let Some(rest) = tok.strip_prefix(prefix) {
            let delta: i64 = if rest.is_empty() {
                0
            } else {
                rest.parse().expect("offset")
            };
            return (base as i64 + delta).to_string();
        }
    }
    tok.to_owned()
}

impl Default for Keyway {
    fn default() -> Self {
        Keyway::new()
    }
}

/// How a reply is compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compare {
    /// Byte for byte.
    Exact,
    /// An array whose order Redis leaves to its encoding (HKEYS, SMEMBERS):
    /// compared sorted.
    Unordered,
    /// A flat array of pairs (HGETALL): compared as a sorted list of pairs.
    UnorderedPairs,
    /// A random choice (SRANDMEMBER, SPOP): only the reply's shape (kind,
    /// array length) is compared.
    Shape,
    /// A `[cursor, [field, value, ...]]` scan reply: the pairs compared sorted.
    ScanPairs,
    /// A `[cursor, [member, ...]]` scan reply: the members compared sorted.
    ScanMembers,
    /// Exact but for the values that follow these names in any (nested)
    /// flat map (XINFO's `idle`, `seen-time`, radix-tree sizes).
    Masked(&'static [&'static str]),
}

fn mask(frame: Frame, names: &[&str]) -> Frame {
    match frame {
        Frame::Array(items) => {
            let mut out: Vec<Frame> = Vec::with_capacity(items.len());
            let mut masked_next = false;
            for item in items {
                if masked_next {
                    out.push(Frame::Null);
                    masked_next = false;
                    continue;
                }
                masked_next =
                    matches!(&item, Frame::Bulk(b) if names.iter().any(|n| n.as_bytes() == &b[..]));
                out.push(mask(item, names));
            }
            Frame::Array(out)
        }
        f => f,
    }
}

fn sort_key(f: &Frame) -> String {
    format!("{f:?}")
}

/// `frame` in a form that compares equal exactly when Redis and Keyway agree under `how`.
pub fn normalize(frame: Frame, how: Compare) -> Frame {
    match (how, frame) {
        (Compare::Exact, f) => f,
        (Compare::Masked(names), f) => mask(f, names),
        (Compare::Unordered, Frame::Array(mut items)) => {
            items.sort_by_key(sort_key);
            Frame::Array(items)
        }
        (Compare::UnorderedPairs, Frame::Array(items)) => {
            let mut pairs: Vec<Frame> = items.chunks(2).map(|c| Frame::Array(c.to_vec())).collect();
            pairs.sort_by_key(sort_key);
            Frame::Array(pairs)
        }
        (Compare::Shape, Frame::Array(items)) => {
            Frame::Array(items.iter().map(|_| Frame::Null).collect())
        }
        (Compare::Shape, Frame::Bulk(_)) => Frame::Bulk(Bytes::new()),
        (Compare::ScanPairs | Compare::ScanMembers, Frame::Array(mut parts))
            if parts.len() == 2 =>
        {
            let items = parts.pop().expect("two parts");
            let inner = match how {
                Compare::ScanPairs => Compare::UnorderedPairs,
                _ => Compare::Unordered,
            };
            parts.push(normalize(items, inner));
            Frame::Array(parts)
        }
        (_, f) => f,
    }
}

/// Most pages a scan is followed for before it counts as not ending.
const SCAN_PAGES_MAX: usize = 1_000;

/// A scan command's reply, followed to its end: `[0, every item returned
/// on the way]`, items deduplicated and compared sorted. Where a scan's
/// first page ends is the implementation's choice (Redis 7.0 returns a
/// non-zero cursor for a small set while its hash table is rehashing, with
/// every member already returned); what a whole scan returns is the
/// contract. A reply that is not `[cursor, [items]]` (an error) is
/// compared as it is.
fn scan_whole(call: &mut dyn FnMut(&[Bytes]) -> Frame, cmd: &[Bytes], how: Compare) -> Frame {
    let pairs = how == Compare::ScanPairs;
    let mut reply = call(cmd);
    let mut items: Vec<Frame> = Vec::new();
    for _ in 0..SCAN_PAGES_MAX {
        let Frame::Array(parts) = &reply else {
            return reply;
        };
        let [Frame::Bulk(cursor), Frame::Array(page)] = parts.as_slice() else {
            return reply;
        };
        if pairs {
            items.extend(page.chunks(2).map(|c| Frame::Array(c.to_vec())));
        } else {
            items.extend(page.iter().cloned());
        }
        if &cursor[..] == b"0" {
            items.sort_by_key(sort_key);
            items.dedup();
            return Frame::Array(vec![Frame::Bulk(cursor.clone()), Frame::Array(items)]);
        }
        let mut next = cmd.to_vec();
        next[2] = cursor.clone();
        reply = call(&next);
    }
    Frame::Error(format!("scan did not end within {SCAN_PAGES_MAX} pages"))
}

/// What a family's differential test provides.
pub struct Family<'a> {
    /// For the report.
    pub name: &'a str,
    /// The keys the generated commands use (compared at the end of each case).
    pub keys: &'a [&'a str],
    /// How to compare the reply to `args`.
    pub compare: &'a dyn Fn(&[Bytes]) -> Compare,
    /// Read commands whose replies make up a key's final state (after `TYPE`).
    pub state: &'a dyn Fn(&str) -> Vec<Vec<Bytes>>,
}

/// Arguments from string parts.
pub fn args(parts: &[&str]) -> Vec<Bytes> {
    parts
        .iter()
        .map(|p| Bytes::copy_from_slice(p.as_bytes()))
        .collect()
}

/// Cases to run: `default_cases`, or ten times as many with `KEYWAY_DIFF_LONG=1`,
/// or exactly `KEYWAY_DIFF_CASES`.
pub fn cases(default_cases: u32) -> u32 {
    if let Some(n) = std::env::var("KEYWAY_DIFF_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return n;
    }
    match std::env::var("KEYWAY_DIFF_LONG").as_deref() {
        Ok("1") => default_cases * 10,
        _ => default_cases,
    }
}

/// Replays one sequence on a flushed Redis and a fresh Keyway; `Err` names
/// the first differing reply or key state.
pub fn check_sequence(
    redis: &mut Redis,
    family: &Family<'_>,
    seq: &[Vec<Bytes>],
) -> Result<(), String> {
    redis.call(&args(&["FLUSHALL"]));
    let ours = Keyway::new();
    for (i, cmd) in seq.iter().enumerate() {
        let how = (family.compare)(cmd);
        let (expected, got) = match how {
            Compare::ScanPairs | Compare::ScanMembers => (
                scan_whole(&mut |c| redis.call(c), cmd, how),
                scan_whole(&mut |c| ours.call(c, Protocol::Resp2), cmd, how),
            ),
            _ => (
                normalize(redis.call(cmd), how),
                normalize(ours.call(cmd, Protocol::Resp2), how),
            ),
        };
        if expected != got {
            return Err(format!(
                "command {i} {}\n  redis:  {expected:?}\n  keyway: {got:?}",
                show(cmd)
            ));
        }
    }
    for key in family.keys {
        let mut reads = vec![args(&["TYPE", key])];
        reads.extend((family.state)(key));
        for read in reads {
            let how = (family.compare)(&read);
            let expected = normalize(redis.call(&read), how);
            let got = normalize(ours.call(&read, Protocol::Resp2), how);
            if expected != got {
                return Err(format!(
                    "final state {}\n  redis:  {expected:?}\n  keyway: {got:?}",
                    show(&read)
                ));
            }
        }
    }
    Ok(())
}

/// A command as a readable line.
pub fn show(cmd: &[Bytes]) -> String {
    cmd.iter()
        .map(|a| format!("{:?}", String::from_utf8_lossy(a)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs `cases` random sequences from `strategy` on Redis and Keyway; panics
/// with the shrunk counterexample (one command per line) on a mismatch.
/// Returns the number of commands run, or `None` if redis-server is missing.
pub fn run_family<S>(family: &Family<'_>, strategy: S, cases: u32) -> Option<u64>
where
    S: Strategy<Value = Vec<Vec<Bytes>>>,
{
    run_family_on(Redis::start, family, strategy, cases)
}

/// [`run_family`] against the Redis `start` starts (e.g. [`Redis::start_cluster`]).
pub fn run_family_on<S>(
    start: fn() -> Option<Redis>,
    family: &Family<'_>,
    strategy: S,
    cases: u32,
) -> Option<u64>
where
    S: Strategy<Value = Vec<Vec<Bytes>>>,
{
    let Some(redis) = start() else {
        eprintln!("{}: redis-server not available, skipped", family.name);
        return None;
    };
    let redis = std::cell::RefCell::new(redis);
    let ops = std::cell::Cell::new(0u64);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&strategy, |seq| {
        ops.set(ops.get() + seq.len() as u64);
        check_sequence(&mut redis.borrow_mut(), family, &seq).map_err(TestCaseError::fail)
    });
    match result {
        Ok(()) => Some(ops.get()),
        Err(TestError::Fail(why, seq)) => panic!(
            "{}: Keyway differs from Redis on this (shrunk) sequence:\n{}\n{why}",
            family.name,
            seq.iter().map(|c| show(c)).collect::<Vec<_>>().join("\n")
        ),
        Err(e) => panic!("{}: {e}", family.name),
    }
}
