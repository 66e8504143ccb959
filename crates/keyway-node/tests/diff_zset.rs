//! Differential test of the sorted-set commands against a real Redis 7.
//!
//! proptest generates random sequences of sorted-set commands over a handful
//! of keys in one hash tag (small member alphabet; scores from a small set
//! with `inf`, `-inf`, `-0` and decimals; score, lex and rank ranges around
//! the edges, exclusive bounds included), runs each sequence on a private
//! `redis-server` and on `keyway_node::cmd` over a `MemEngine`, and requires
//! identical replies (after a RESP2 round trip) and identical final state
//! (`TYPE` and `ZRANGE k 0 -1 WITHSCORES` of every key). ZRANDMEMBER's
//! replies are random: only their shape and membership are compared. On a
//! mismatch proptest shrinks the sequence and the test prints the smallest
//! failing one.
//!
//! Default: 200 cases of 50 operations (10,000 operations);
//! `KEYWAY_DIFF_LONG=1` runs 2,000 cases of 100. `KEYWAY_DIFF_SEED=<n>`
//! changes the seed. Skipped, with a note on stderr, when `redis-server` is
//! not installed.

use std::cell::RefCell;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use keyway_map::{DEFAULT_KEYSPACE, Keyspace, Routing};
use keyway_node::cmd;
use keyway_node::db::{Db, DbLimits};
use keyway_resp::{Frame, Limits, Protocol, ResponseParser, encode, encode_command};
use keyway_storage::{Engine, MemEngine};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};

struct Redis {
    child: Child,
    conn: TcpStream,
    buf: BytesMut,
    parser: ResponseParser,
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Redis {
    fn start() -> Option<Redis> {
        let port = TcpListener::bind("127.0.0.1:0")
            .ok()?
            .local_addr()
            .ok()?
            .port();
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
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut child = Some(child);
        loop {
            if let Ok(conn) = TcpStream::connect(("127.0.0.1", port)) {
                conn.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
                return Some(Redis {
                    child: child.take()?,
                    conn,
                    buf: BytesMut::new(),
                    parser: ResponseParser::new(Limits::default()),
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

    fn call(&mut self, args: &[Bytes]) -> Frame {
        let mut out = BytesMut::new();
        encode_command(args, &mut out);
        self.conn.write_all(&out).expect("write to redis");
        loop {
            if let Some(frame) = self.parser.parse(&mut self.buf).expect("redis reply") {
                return frame;
            }
            let mut chunk = [0u8; 16384];
            let n = self.conn.read(&mut chunk).expect("read from redis");
            assert!(n > 0, "redis closed the connection");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

struct Keyway {
    engine: MemEngine,
    ks: Keyspace,
    limits: DbLimits,
}

impl Keyway {
    fn new() -> Self {
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
        }
    }

    fn call(&self, args: &[Bytes]) -> Frame {
        let frame = match cmd::parse(args) {
            None => panic!("not a data command: {args:?}"),
            Some(Err(f)) => f,
            Some(Ok(c)) => {
                let keys = c.keys();
                if let Some(first) = keys.first() {
                    let slot = keyway_map::key_hash_slot(first);
                    assert!(
                        keys.iter().all(|k| keyway_map::key_hash_slot(k) == slot),
                        "keys of {args:?} span slots"
                    );
                }
                let mut db = Db::new(&self.engine, &self.ks, now_ms(), &self.limits);
                let reply = c.execute(&mut db).expect("storage");
                self.engine.apply(&db.into_mutations()).expect("apply");
                reply
            }
        };
        let mut wire = BytesMut::new();
        encode(&frame, Protocol::Resp2, &mut wire);
        ResponseParser::new(Limits::default())
            .parse(&mut wire)
            .expect("own reply parses")
            .expect("complete")
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

const KEYS: &[&str] = &["{z}a", "{z}b", "{z}c"];
const STRING_KEY: &str = "{z}s";
const MEMBERS: &[&str] = &["a", "b", "c", "d", "e", "aa", "ab", ""];
const SCORES: &[&str] = &[
    "0", "-0", "1", "-1", "2", "1.5", "-2.5", "0.1", "0.2", "3", "inf", "-inf", "+inf", "1e3",
    "1e-3", "100", "7",
];
const BAD_SCORES: &[&str] = &["x", "nan", "", " 1", "1e999"];
const SCORE_BOUNDS: &[&str] = &[
    "-inf", "+inf", "inf", "0", "-0", "(0", "1", "(1", "1.5", "(1.5", "2", "(2", "-1", "(-1", "3",
    "(3", "(inf", "(-inf", "100", "-2.5",
];
const BAD_SCORE_BOUNDS: &[&str] = &["x", "((1", "nan", "(x"];
const LEX_BOUNDS: &[&str] = &[
    "-", "+", "[a", "(a", "[b", "(b", "[c", "(c", "[aa", "(ab", "[", "(", "[e", "(z",
];
const BAD_LEX_BOUNDS: &[&str] = &["a", "", "+x", "-a"];
const RANKS: &[&str] = &["0", "1", "2", "-1", "-2", "-3", "3", "5", "10", "-10"];

fn pick(items: &'static [&'static str]) -> impl Strategy<Value = String> {
    prop::sample::select(items).prop_map(str::to_owned)
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![10 => pick(KEYS), 1 => Just(STRING_KEY.to_owned())]
}

fn score() -> impl Strategy<Value = String> {
    prop_oneof![20 => pick(SCORES), 1 => pick(BAD_SCORES)]
}

fn score_bound() -> impl Strategy<Value = String> {
    prop_oneof![20 => pick(SCORE_BOUNDS), 1 => pick(BAD_SCORE_BOUNDS)]
}

fn lex_bound() -> impl Strategy<Value = String> {
    prop_oneof![20 => pick(LEX_BOUNDS), 1 => pick(BAD_LEX_BOUNDS)]
}

fn member() -> impl Strategy<Value = String> {
    pick(MEMBERS)
}

fn limit() -> impl Strategy<Value = Vec<String>> {
    prop_oneof![
        3 => Just(vec![]),
        2 => (pick(&["0", "1", "2", "-1", "5"]), pick(&["0", "1", "2", "-1", "-5", "10"]))
            .prop_map(|(o, c)| vec!["LIMIT".into(), o, c]),
    ]
}

fn flag(name: &'static str) -> impl Strategy<Value = Vec<String>> {
    prop_oneof![Just(vec![]), Just(vec![name.to_owned()])]
}

/// ZADD's options, in a random order and case (occasionally conflicting).
fn zadd_options() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(
        prop_oneof![
            pick(&["NX", "XX", "GT", "LT", "CH", "ch", "INCR"]),
            pick(&["xx", "gt", "ch", "lt"]),
        ],
        0..3,
    )
}

fn sources() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(pick(KEYS), 1..4)
}

/// The algebra options after the keys.
fn algebra_options(n: usize, store: bool) -> impl Strategy<Value = Vec<String>> {
    let weights = prop::collection::vec(pick(&["1", "2", "0", "-1", "0.5", "inf", "x"]), n);
    (
        prop_oneof![2 => Just(None), 1 => weights.prop_map(Some)],
        prop_oneof![2 => Just(None), 1 => pick(&["SUM", "MIN", "MAX", "avg"]).prop_map(Some)],
        any::<bool>(),
    )
        .prop_map(move |(w, a, ws)| {
            let mut out = Vec::new();
            if let Some(w) = w {
                out.push("WEIGHTS".to_owned());
                out.extend(w);
            }
            if let Some(a) = a {
                out.push("AGGREGATE".to_owned());
                out.push(a);
            }
            if ws && !store {
                out.push("WITHSCORES".to_owned());
            }
            out
        })
}

fn join(mut a: Vec<String>, b: Vec<String>) -> Vec<String> {
    a.extend(b);
    a
}

/// One random command.
fn op() -> impl Strategy<Value = Vec<String>> {
    let zadd = (
        key(),
        zadd_options(),
        prop::collection::vec((score(), member()), 1..4),
    )
        .prop_map(|(k, opts, pairs)| {
            let mut a = vec!["ZADD".to_owned(), k];
            a.extend(opts);
            for (s, m) in pairs {
                a.push(s);
                a.push(m);
            }
            a
        });
    let writes = prop_oneof![
        6 => zadd,
        2 => (key(), score(), member()).prop_map(|(k, s, m)| vec!["ZINCRBY".into(), k, s, m]),
        2 => (key(), prop::collection::vec(member(), 1..4)).prop_map(|(k, ms)| join(vec!["ZREM".into(), k], ms)),
        1 => (key(), pick(RANKS), pick(RANKS)).prop_map(|(k, a, b)| vec!["ZREMRANGEBYRANK".into(), k, a, b]),
        1 => (key(), score_bound(), score_bound()).prop_map(|(k, a, b)| vec!["ZREMRANGEBYSCORE".into(), k, a, b]),
        1 => (key(), lex_bound(), lex_bound()).prop_map(|(k, a, b)| vec!["ZREMRANGEBYLEX".into(), k, a, b]),
        2 => (pick(&["ZPOPMIN", "ZPOPMAX"]), key(), prop_oneof![Just(None), pick(&["0", "1", "2", "5", "-1", "x"]).prop_map(Some)])
            .prop_map(|(c, k, n)| {
                let mut a = vec![c.to_owned(), k];
                a.extend(n);
                a
            }),
        1 => (sources(), pick(&["MIN", "MAX", "max", "mid"]), prop_oneof![Just(vec![]), pick(&["1", "2", "10", "0"]).prop_map(|n| vec!["COUNT".into(), n])])
            .prop_map(|(keys, w, count)| {
                let mut a = vec!["ZMPOP".to_owned(), keys.len().to_string()];
                a.extend(keys);
                a.push(w);
                a.extend(count);
                a
            }),
        1 => (key(), key(), pick(RANKS), pick(RANKS), pick(&["", "REV"])).prop_map(|(d, s, a, b, rev)| {
            let mut v = vec!["ZRANGESTORE".to_owned(), d, s, a, b];
            if !rev.is_empty() { v.push(rev.to_owned()); }
            v
        }),
        1 => (key(), key(), score_bound(), score_bound(), flag("REV"), limit()).prop_map(|(d, s, a, b, rev, l)| {
            join(join(vec!["ZRANGESTORE".into(), d, s, a, b, "BYSCORE".into()], rev), l)
        }),
        1 => (key(), key(), lex_bound(), lex_bound(), flag("REV"), limit()).prop_map(|(d, s, a, b, rev, l)| {
            join(join(vec!["ZRANGESTORE".into(), d, s, a, b, "BYLEX".into()], rev), l)
        }),
        2 => (pick(&["ZUNIONSTORE", "ZINTERSTORE", "ZDIFFSTORE"]), key(), sources())
            .prop_flat_map(|(c, d, keys)| {
                let n = keys.len();
                (Just(c), Just(d), Just(keys), algebra_options(n, true))
            })
            .prop_map(|(c, d, keys, opts)| {
                let mut a = vec![c.to_owned(), d, keys.len().to_string()];
                a.extend(keys);
                if c != "ZDIFFSTORE" { a.extend(opts); }
                a
            }),
        1 => key().prop_map(|k| vec!["DEL".into(), k]),
        1 => Just(vec!["SET".to_owned(), STRING_KEY.to_owned(), "v".to_owned()]),
    ];
    let reads = prop_oneof![
        2 => (key(), member()).prop_map(|(k, m)| vec!["ZSCORE".into(), k, m]),
        1 => (key(), prop::collection::vec(member(), 1..4)).prop_map(|(k, ms)| join(vec!["ZMSCORE".into(), k], ms)),
        1 => key().prop_map(|k| vec!["ZCARD".into(), k]),
        2 => (pick(&["ZRANK", "ZREVRANK"]), key(), member()).prop_map(|(c, k, m)| vec![c.into(), k, m]),
        2 => (key(), score_bound(), score_bound()).prop_map(|(k, a, b)| vec!["ZCOUNT".into(), k, a, b]),
        2 => (key(), lex_bound(), lex_bound()).prop_map(|(k, a, b)| vec!["ZLEXCOUNT".into(), k, a, b]),
        3 => (key(), pick(RANKS), pick(RANKS), flag("REV"), flag("WITHSCORES"), prop_oneof![4 => Just(vec![]), 1 => limit()])
            .prop_map(|(k, a, b, rev, ws, l)| join(join(join(vec!["ZRANGE".into(), k, a, b], rev), ws), l)),
        3 => (key(), score_bound(), score_bound(), flag("REV"), flag("WITHSCORES"), limit())
            .prop_map(|(k, a, b, rev, ws, l)| join(join(join(vec!["ZRANGE".into(), k, a, b, "BYSCORE".into()], rev), ws), l)),
        3 => (key(), lex_bound(), lex_bound(), flag("REV"), limit(), prop_oneof![6 => Just(vec![]), 1 => Just(vec!["WITHSCORES".to_owned()])])
            .prop_map(|(k, a, b, rev, l, ws)| join(join(join(vec!["ZRANGE".into(), k, a, b, "BYLEX".into()], rev), l), ws)),
        2 => (pick(&["ZRANGEBYSCORE", "ZREVRANGEBYSCORE"]), key(), score_bound(), score_bound(), flag("WITHSCORES"), limit())
            .prop_map(|(c, k, a, b, ws, l)| join(join(vec![c.into(), k, a, b], ws), l)),
        2 => (pick(&["ZRANGEBYLEX", "ZREVRANGEBYLEX"]), key(), lex_bound(), lex_bound(), limit())
            .prop_map(|(c, k, a, b, l)| join(vec![c.into(), k, a, b], l)),
        1 => (key(), pick(RANKS), pick(RANKS), flag("WITHSCORES")).prop_map(|(k, a, b, ws)| join(vec!["ZREVRANGE".into(), k, a, b], ws)),
        2 => (pick(&["ZUNION", "ZINTER", "ZDIFF"]), sources())
            .prop_flat_map(|(c, keys)| {
                let n = keys.len();
                (Just(c), Just(keys), algebra_options(n, false))
            })
            .prop_map(|(c, keys, opts)| {
                let mut a = vec![c.to_owned(), keys.len().to_string()];
                a.extend(keys);
                if c == "ZDIFF" {
                    if opts.last().is_some_and(|o| o == "WITHSCORES") { a.push("WITHSCORES".into()); }
                } else {
                    a.extend(opts);
                }
                a
            }),
        1 => (sources(), prop_oneof![Just(vec![]), pick(&["0", "1", "2", "-1"]).prop_map(|n| vec!["LIMIT".into(), n])])
            .prop_map(|(keys, l)| {
                let mut a = vec!["ZINTERCARD".to_owned(), keys.len().to_string()];
                a.extend(keys);
                a.extend(l);
                a
            }),
        1 => (key(), prop_oneof![Just(vec![]), pick(&["1", "3", "0"]).prop_map(|n| vec!["COUNT".into(), n])], prop_oneof![Just(vec![]), pick(&["a*", "*", "?", "[ab]*"]).prop_map(|p| vec!["MATCH".into(), p])])
            .prop_map(|(k, c, m)| join(join(vec!["ZSCAN".into(), k, "0".into()], c), m)),
        1 => (key(), prop_oneof![Just(vec![]), pick(&["1", "2", "5", "-3", "0", "-1"]).prop_map(|n| vec![n]), pick(&["2", "-4", "10"]).prop_map(|n| vec![n, "WITHSCORES".into()])])
            .prop_map(|(k, rest)| join(vec!["ZRANDMEMBER".into(), k], rest)),
        1 => key().prop_map(|k| vec!["TYPE".into(), k]),
    ];
    prop_oneof![1 => writes, 1 => reads]
}

fn to_args(parts: &[String]) -> Vec<Bytes> {
    parts
        .iter()
        .map(|s| Bytes::copy_from_slice(s.as_bytes()))
        .collect()
}

/// ZRANDMEMBER: equal shapes (null, bulk, array length) only.
fn same_shape(a: &Frame, b: &Frame) -> bool {
    match (a, b) {
        (Frame::Array(x), Frame::Array(y)) => x.len() == y.len(),
        (Frame::Bulk(_), Frame::Bulk(_)) => true,
        (x, y) => x == y,
    }
}

/// ZRANDMEMBER's members all exist in the key on Keyway (scores match when given).
fn members_exist(ours: &Keyway, key: &str, reply: &Frame, withscores: bool) -> bool {
    let check = |m: &Frame, s: Option<&Frame>| {
        let Frame::Bulk(m) = m else { return false };
        let score = ours.call(&[
            Bytes::from_static(b"ZSCORE"),
            Bytes::copy_from_slice(key.as_bytes()),
            m.clone(),
        ]);
        score != Frame::Null && s.is_none_or(|s| *s == score)
    };
    match reply {
        Frame::Array(items) if withscores => items.chunks(2).all(|p| check(&p[0], p.get(1))),
        Frame::Array(items) => items.iter().all(|m| check(m, None)),
        Frame::Bulk(_) => check(reply, None),
        _ => true,
    }
}

fn run_case(redis: &mut Redis, ops: &[Vec<String>]) -> Result<(), TestCaseError> {
    redis.call(&[Bytes::from_static(b"FLUSHALL")]);
    let ours = Keyway::new();
    for (i, op) in ops.iter().enumerate() {
        let args = to_args(op);
        let expected = redis.call(&args);
        let got = ours.call(&args);
        let random = op[0] == "ZRANDMEMBER";
        let ok = if random {
            same_shape(&expected, &got)
                && members_exist(
                    &ours,
                    &op[1],
                    &got,
                    op.last().is_some_and(|o| o == "WITHSCORES"),
                )
        } else {
            expected == got
        };
        if !ok {
            return Err(TestCaseError::fail(format!(
                "op {i}: {}\n  redis:  {expected:?}\n  keyway: {got:?}",
                op.join(" ")
            )));
        }
    }
    for key in KEYS.iter().chain([&STRING_KEY]) {
        for probe in [
            vec!["TYPE", key],
            vec!["ZRANGE", key, "0", "-1", "WITHSCORES"],
        ] {
            let args: Vec<Bytes> = probe
                .iter()
                .map(|s| Bytes::copy_from_slice(s.as_bytes()))
                .collect();
            let (expected, got) = (redis.call(&args), ours.call(&args));
            if expected != got {
                return Err(TestCaseError::fail(format!(
                    "final state: {}\n  redis:  {expected:?}\n  keyway: {got:?}",
                    probe.join(" ")
                )));
            }
        }
    }
    Ok(())
}

#[test]
fn random_zset_commands_match_redis_7() {
    let Some(redis) = Redis::start() else {
        eprintln!("diff_zset: redis-server not available, skipped");
        return;
    };
    let long = std::env::var("KEYWAY_DIFF_LONG").is_ok_and(|v| v == "1");
    let (cases, ops_per_case) = if long { (4000, 100) } else { (450, 50) };
    let seed: u64 = std::env::var("KEYWAY_DIFF_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_2a5e_7000_0014);
    let mut seed_bytes = [0u8; 32];
    for (i, chunk) in seed_bytes.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(&(seed.wrapping_add(i as u64)).to_le_bytes());
    }
    let config = Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 2000,
        ..Config::default()
    };
    let mut runner = TestRunner::new_with_rng(
        config,
        TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes),
    );
    let redis = RefCell::new(redis);
    let total = RefCell::new(0usize);
    let strategy = prop::collection::vec(op(), 1..=ops_per_case);
    let result = runner.run(&strategy, |ops| {
        *total.borrow_mut() += ops.len();
        run_case(&mut redis.borrow_mut(), &ops)
    });
    match result {
        Ok(()) => eprintln!("diff_zset: {} operations matched Redis", total.borrow()),
        Err(TestError::Fail(reason, ops)) => {
            let script: Vec<String> = ops.iter().map(|o| o.join(" ")).collect();
            panic!(
                "mismatch: {reason}\nsmallest failing sequence:\n{}",
                script.join("\n")
            );
        }
        Err(e) => panic!("{e}"),
    }
}
