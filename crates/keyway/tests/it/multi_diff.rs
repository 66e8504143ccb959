//! Differential test of transactions against a real `redis-server`:
//! random sequences of `MULTI EXEC DISCARD WATCH UNWATCH`, data commands
//! (some with runtime errors, some with queue-time errors: unknown command,
//! wrong arity) from a transaction client, interleaved with writes from a
//! second client on the same keys (so `WATCH` aborts happen), run on Redis
//! 7 and on a one-node `keyway dev`; every reply must be identical. The
//! keys share one hash tag (one slot), so Redis's standalone answers are
//! what Redis Cluster answers. On a mismatch the seed and the history up
//! to it are printed; `KEYWAY_TEST_SEED=N` replays one seed.
//! Skipped (with a note) when `redis-server` is not installed.

use crate::common;

use common::{DevCluster, Resp};
use keyway_resp::Frame;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const OPS_PER_SEED: usize = 2500;
const SEEDS: u64 = 4;

struct RedisServer(Child);

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_redis() -> Option<(RedisServer, u16)> {
    // Below the ephemeral range, so no other test's bind(0) or outgoing
    // connection takes it before redis-server binds it.
    let port = keyway_testkit::free_port_block(1);
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let server = RedisServer(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if Resp::try_connect(port, Duration::from_secs(1)).is_ok() {
            return Some((server, port));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

const KEYS: [&str; 3] = ["{t}a", "{t}b", "{t}c"];
/// One key per collection type (commands of other types on them: WRONGTYPE).
const HASH: &str = "{t}h";
const LIST: &str = "{t}l";
const SET: &str = "{t}s";
const ZSET: &str = "{t}z";
const ALL_KEYS: [&str; 7] = ["{t}a", "{t}b", "{t}c", HASH, LIST, SET, ZSET];

/// One random request: `(from the second client?, args)`.
fn random_op(rng: &mut StdRng) -> (bool, Vec<String>) {
    fn key(rng: &mut StdRng) -> String {
        ALL_KEYS[rng.random_range(0..ALL_KEYS.len())].to_string()
    }
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let k = key(rng);
    let other = rng.random_bool(0.15);
    let n = rng.random_range(1..=3).to_string();
    if other {
        let op = match rng.random_range(0..9) {
            0 => s(&["SET", &k, "x"]),
            1 => s(&["DEL", &k]),
            2 => s(&["INCR", &k]),
            3 => s(&["EXPIRE", &k, "1000"]),
            4 => s(&["HSET", HASH, &n, "o"]),
            5 => s(&["RPUSH", LIST, "o"]),
            6 => s(&["SADD", SET, &n]),
            7 => s(&["ZINCRBY", ZSET, "1", &n]),
            _ => s(&["GET", &k]),
        };
        return (true, op);
    }
    let op = match rng.random_range(0..35) {
        34 => s(&["SINTERCARD", "0", &k]),
        22 => s(&["HSET", HASH, &n, &n]),
        23 => s(&["HINCRBY", HASH, &n, "2"]),
        24 => s(&["HGET", HASH, &n]),
        25 => s(&["LPUSH", LIST, &n]),
        26 => s(&["RPOP", LIST]),
        27 => s(&["LRANGE", LIST, "0", "-1"]),
        28 => s(&["SADD", SET, &n]),
        29 => s(&["SREM", SET, &n]),
        30 => s(&["SCARD", SET]),
        31 => s(&["ZADD", ZSET, &n, &n]),
        32 => s(&["ZRANGE", ZSET, "0", "-1", "WITHSCORES"]),
        33 => s(&["HLEN", &k]),
        0..=2 => s(&["MULTI"]),
        3..=4 => s(&["EXEC"]),
        5 => s(&["DISCARD"]),
        6..=7 => {
            let mut w = s(&["WATCH"]);
            for _ in 0..rng.random_range(1..=2) {
                w.push(key(rng));
            }
            w
        }
        8 => s(&["UNWATCH"]),
        9 => s(&["SET", &k, &n]),
        10 => s(&["INCR", &k]),
        11 => s(&["INCRBY", &k, &n]),
        12 => s(&["GET", &k]),
        13 => s(&["DEL", &k]),
        14 => s(&["APPEND", &k, "z"]),
        15 => s(&["EXPIRE", &k, "1000"]),
        16 => s(&["PERSIST", &k]),
        17 => s(&["PING"]),
        18 => s(&["NOSUCHCMD", &k]),
        19 => s(&["GET"]),
        20 => s(&["SET", &k, "v", "NX", "XX"]),
        _ => s(&["MGET", KEYS[0], KEYS[1], KEYS[2]]),
    };
    (false, op)
}

#[test]
fn transactions_reply_as_redis_does() {
    let Some((_redis, redis_port)) = start_redis() else {
        eprintln!("redis-server not installed: multi_diff skipped");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cluster = DevCluster::start(1, &dir.path().join("data"), &[]);
    compare(redis_port, cluster.ports()[0]);
}

/// The same through `keyway proxy` (which queues the transaction itself and
/// sends it to the owner as one request) in front of two nodes.
#[test]
fn transactions_through_the_proxy_reply_as_redis_does() {
    let Some((_redis, redis_port)) = start_redis() else {
        eprintln!("redis-server not installed: multi_diff skipped");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cluster = DevCluster::start(2, &dir.path().join("data"), &[]);
    let base = common::free_port_block(2);
    let meta = format!("keyway://127.0.0.1:{}", cluster.base());
    let args: Vec<String> = [
        "proxy",
        "--meta",
        &meta,
        "--listen",
        &format!("127.0.0.1:{base}"),
        "--admin-listen",
        &format!("127.0.0.1:{}", base + 1),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let _proxy = common::Proc::spawn(&args, "serving");
    compare(redis_port, base);
}

fn compare(redis_port: u16, kw_port: u16) {
    let seeds: Vec<u64> = match std::env::var("KEYWAY_TEST_SEED") {
        Ok(s) => vec![s.parse().expect("KEYWAY_TEST_SEED must be a number")],
        Err(_) => (0..SEEDS).map(|_| rand::random()).collect(),
    };
    let mut total = 0;
    let (mut watch_aborts, mut execaborts, mut execs) = (0, 0, 0);
    for seed in seeds {
        let mut rng = StdRng::seed_from_u64(seed);
        let (mut r1, mut r2) = (Resp::connect(redis_port), Resp::connect(redis_port));
        let (mut k1, mut k2) = (Resp::connect(kw_port), Resp::connect(kw_port));
        for c in [&mut r1, &mut k1] {
            let mut del = vec!["DEL"];
            del.extend(ALL_KEYS);
            c.cmd(&del);
        }
        let mut history = Vec::new();
        for _ in 0..OPS_PER_SEED {
            let (other, op) = random_op(&mut rng);
            let args: Vec<&str> = op.iter().map(|s| s.as_str()).collect();
            let (expected, got): (Frame, Frame) = if other {
                (r2.cmd(&args), k2.cmd(&args))
            } else {
                (r1.cmd(&args), k1.cmd(&args))
            };
            history.push(format!(
                "{} {}  -> {expected:?}",
                if other { "other:" } else { "tx:   " },
                op.join(" ")
            ));
            assert_eq!(
                got,
                expected,
                "seed {seed} (KEYWAY_TEST_SEED={seed} replays): reply differs from Redis at step {}; history:\n{}",
                history.len(),
                history[history.len().saturating_sub(40)..].join("\n")
            );
            total += 1;
            match (&op[0][..], &expected) {
                ("EXEC", Frame::NullArray) => watch_aborts += 1,
                ("EXEC", Frame::Error(e)) if e.starts_with("EXECABORT") => execaborts += 1,
                ("EXEC", Frame::Array(_)) => execs += 1,
                _ => {}
            }
        }
    }
    println!(
        "{total} requests replied as Redis does: {execs} EXECs ran, {watch_aborts} aborted by WATCH, {execaborts} EXECABORT"
    );
    assert!(
        execs > 0 && watch_aborts > 0 && execaborts > 0,
        "the random sequences missed an EXEC outcome"
    );
}

/// Writes that change nothing (SADD of a member, ZADD of the same score,
/// ZREM of a non-member, ...) do not touch a watched key, and those Redis
/// counts as a modification even without a change (HSET of the same value,
/// SET of the same value, LTRIM keeping everything) do: for each, whether a
/// `WATCH`ed transaction runs is Redis's answer.
#[test]
fn watched_keys_touched_exactly_when_redis_touches_them() {
    let Some((_redis, redis_port)) = start_redis() else {
        eprintln!("redis-server not installed: multi_diff skipped");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cluster = DevCluster::start(1, &dir.path().join("data"), &[]);
    let cases: &[(&[&str], &[&str])] = &[
        (&["SADD", "{w}k", "a"], &["SADD", "{w}k", "a"]),
        (&["SADD", "{w}k", "a"], &["SADD", "{w}k", "b"]),
        (&["SADD", "{w}k", "a"], &["SREM", "{w}k", "zz"]),
        (&["HSET", "{w}k", "f", "v"], &["HDEL", "{w}k", "zz"]),
        (&["HSET", "{w}k", "f", "v"], &["HSET", "{w}k", "f", "v"]),
        (&["HSET", "{w}k", "f", "v"], &["HSETNX", "{w}k", "f", "w"]),
        (&["HSET", "{w}k", "f", "1"], &["HINCRBY", "{w}k", "f", "0"]),
        (&["ZADD", "{w}k", "1", "m"], &["ZADD", "{w}k", "1", "m"]),
        (&["ZADD", "{w}k", "1", "m"], &["ZADD", "{w}k", "2", "m"]),
        (
            &["ZADD", "{w}k", "1", "m"],
            &["ZADD", "{w}k", "NX", "2", "m"],
        ),
        (&["ZADD", "{w}k", "1", "m"], &["ZINCRBY", "{w}k", "0", "m"]),
        (&["ZADD", "{w}k", "1", "m"], &["ZREM", "{w}k", "zz"]),
        (&["RPUSH", "{w}k", "a"], &["LREM", "{w}k", "0", "zz"]),
        (&["RPUSH", "{w}k", "a"], &["LPUSHX", "{w}k", "b"]),
        (&["RPUSH", "{w}k", "a"], &["LTRIM", "{w}k", "0", "-1"]),
        (&["SADD", "{w}k", "a"], &["SMOVE", "{w}k", "{w}k2", "zz"]),
        (&["SET", "{w}k", "v"], &["EXPIRE", "{w}k", "100"]),
        (&["SET", "{w}k", "v"], &["PERSIST", "{w}k"]),
        (&["SET", "{w}k", "v"], &["SET", "{w}k", "v"]),
        (&["SET", "{w}k", "v"], &["SETRANGE", "{w}k", "0", ""]),
        (&["SET", "{w}k", "v"], &["DEL", "{w}nosuch"]),
    ];
    let outcome = |port: u16, setup: &[&str], noop: &[&str]| {
        let (mut a, mut b) = (Resp::connect(port), Resp::connect(port));
        a.cmd(&["DEL", "{w}k", "{w}k2"]);
        a.cmd(setup);
        a.cmd(&["WATCH", "{w}k"]);
        b.cmd(noop);
        a.cmd(&["MULTI"]);
        a.cmd(&["PING"]);
        a.cmd(&["EXEC"])
    };
    let mut wrong = Vec::new();
    for (setup, noop) in cases {
        let expected = outcome(redis_port, setup, noop);
        let got = outcome(cluster.ports()[0], setup, noop);
        if expected != got {
            wrong.push(format!(
                "{setup:?} then {noop:?}: redis {expected:?}, keyway {got:?}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
