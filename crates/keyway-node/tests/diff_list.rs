//! Differential test of the list commands against a real Redis 7: random
//! command sequences (proptest, shrunk on a mismatch) on a few lists of one
//! hash tag, with a small element alphabet (so pushes, pops, LREM, LPOS and
//! LINSERT collide) and indices around the edges, negatives included; every
//! reply and the final state (`TYPE`, `LRANGE 0 -1`, `GET`) compared.
//! `KEYWAY_DIFF_LONG=1` runs ten times as many cases.
//!
//! The blocking commands are compared in their non-blocking form: Redis runs
//! them inside `MULTI`/`EXEC` (where they never block), Keyway runs
//! `Command::execute` (what its MULTI and a blocking command's attempt run).
//! Their blocking itself is tested against a live node in
//! `crates/keyway/tests/it/blocking.rs`.
//!
//! Also: `COMMAND INFO` (RESP3), `COMMAND DOCS` and `COMMAND GETKEYS` of the
//! list commands match Redis 7.0.

mod diff;

use bytes::Bytes;
use diff::{Compare, Keyway, Redis, args, cases, normalize, show};
use keyway_resp::{Frame, Protocol};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};

const KEYS: &[&str] = &["{l}a", "{l}b", "{l}c"];
/// A string key of the same slot, for WRONGTYPE.
const STRING_KEY: &str = "{l}s";

const LIST_COMMANDS: &[&str] = &[
    "lpush",
    "rpush",
    "lpushx",
    "rpushx",
    "lpop",
    "rpop",
    "llen",
    "lindex",
    "lset",
    "lrange",
    "ltrim",
    "lrem",
    "linsert",
    "lpos",
    "lmove",
    "rpoplpush",
    "lmpop",
    "blpop",
    "brpop",
    "blmove",
    "brpoplpush",
    "blmpop",
];

fn s(v: &[&'static str]) -> impl Strategy<Value = String> + Clone {
    prop::sample::select(v.to_vec()).prop_map(String::from)
}

fn key() -> impl Strategy<Value = String> + Clone {
    prop_oneof![12 => s(KEYS), 1 => Just(STRING_KEY.to_string())]
}

fn element() -> impl Strategy<Value = String> + Clone {
    s(&["a", "b", "c", ""])
}

fn index() -> impl Strategy<Value = String> + Clone {
    prop_oneof![
        6 => (-4i64..5).prop_map(|i| i.to_string()),
        1 => s(&["100", "-100", "9223372036854775807", "-9223372036854775808", "x", "1.0", "+1", ""]),
    ]
}

fn count() -> impl Strategy<Value = String> + Clone {
    prop_oneof![
        6 => (0i64..5).prop_map(|i| i.to_string()),
        1 => s(&["-1", "-2", "100", "x", "", "9223372036854775807"]),
    ]
}

fn side() -> impl Strategy<Value = String> + Clone {
    prop_oneof![8 => s(&["left", "RIGHT", "Left", "right"]), 1 => s(&["up", ""])]
}

fn timeout() -> impl Strategy<Value = String> + Clone {
    prop_oneof![8 => s(&["0", "0.01", "1"]), 1 => s(&["-1", "x", "inf", "-0.0001"])]
}

fn line(parts: Vec<String>) -> Vec<Bytes> {
    parts.into_iter().map(Bytes::from).collect()
}

fn keys(n: std::ops::Range<usize>) -> impl Strategy<Value = Vec<String>> + Clone {
    prop::collection::vec(key(), n)
}

fn list_command() -> impl Strategy<Value = Vec<Bytes>> {
    let push = (
        s(&["lpush", "rpush", "lpushx", "rpushx"]),
        key(),
        prop::collection::vec(element(), 1..4),
    )
        .prop_map(|(c, k, es)| {
            let mut a = vec![c, k];
            a.extend(es);
            a
        });
    let pop = (
        s(&["lpop", "rpop"]),
        key(),
        prop::option::of(count()),
        any::<bool>(),
    )
        .prop_map(|(c, k, n, extra)| {
            let mut a = vec![c, k];
            a.extend(n);
            if extra {
                a.push("1".into());
            }
            a
        });
    let lpos = (
        key(),
        element(),
        prop::collection::vec((s(&["rank", "COUNT", "maxlen", "bogus"]), index()), 0..3),
        any::<bool>(),
    )
        .prop_map(|(k, e, opts, dangling)| {
            let mut a = vec!["lpos".to_string(), k, e];
            for (o, v) in opts {
                a.push(o);
                a.push(v);
            }
            if dangling {
                a.push("rank".into());
            }
            a
        });
    let mpop = (
        s(&["1", "2", "3", "0", "-1", "x"]),
        keys(1..4),
        side(),
        prop::option::of(count()),
    )
        .prop_map(|(n, ks, sd, c)| {
            let mut a = vec!["lmpop".to_string(), n];
            a.extend(ks);
            a.push(sd);
            if let Some(c) = c {
                a.push("count".into());
                a.push(c);
            }
            a
        });
    let bpop = (s(&["blpop", "brpop"]), keys(1..4), timeout()).prop_map(|(c, ks, t)| {
        let mut a = vec![c];
        a.extend(ks);
        a.push(t);
        a
    });
    let bmpop = (
        timeout(),
        s(&["1", "2", "0", "x"]),
        keys(1..3),
        side(),
        prop::option::of(count()),
    )
        .prop_map(|(t, n, ks, sd, c)| {
            let mut a = vec!["blmpop".to_string(), t, n];
            a.extend(ks);
            a.push(sd);
            if let Some(c) = c {
                a.push("COUNT".into());
                a.push(c);
            }
            a
        });
    prop_oneof![
        8 => push,
        5 => pop,
        2 => key().prop_map(|k| vec!["llen".into(), k]),
        3 => (key(), index()).prop_map(|(k, i)| vec!["lindex".into(), k, i]),
        2 => (key(), index(), element()).prop_map(|(k, i, e)| vec!["lset".into(), k, i, e]),
        3 => (key(), index(), index()).prop_map(|(k, a, b)| vec!["lrange".into(), k, a, b]),
        2 => (key(), index(), index()).prop_map(|(k, a, b)| vec!["ltrim".into(), k, a, b]),
        3 => (key(), index(), element()).prop_map(|(k, n, e)| vec!["lrem".into(), k, n, e]),
        3 => (key(), s(&["before", "AFTER", "middle"]), element(), element())
            .prop_map(|(k, w, p, e)| vec!["linsert".into(), k, w, p, e]),
        3 => lpos,
        3 => (key(), key(), side(), side()).prop_map(|(a, b, x, y)| vec!["lmove".into(), a, b, x, y]),
        1 => (key(), key()).prop_map(|(a, b)| vec!["rpoplpush".into(), a, b]),
        2 => mpop,
        2 => bpop,
        1 => (key(), key(), side(), side(), timeout())
            .prop_map(|(a, b, x, y, t)| vec!["blmove".into(), a, b, x, y, t]),
        1 => (key(), key(), timeout()).prop_map(|(a, b, t)| vec!["brpoplpush".into(), a, b, t]),
        1 => bmpop,
        1 => (key(), element()).prop_map(|(k, v)| vec!["set".into(), k, v]),
        1 => (key(), s(&["del", "type", "exists", "get"])).prop_map(|(k, c)| vec![c, k]),
    ]
    .prop_map(line)
}

fn is_blocking(cmd: &[Bytes]) -> bool {
    let name = String::from_utf8_lossy(&cmd[0]).to_ascii_lowercase();
    matches!(
        name.as_str(),
        "blpop" | "brpop" | "blmove" | "brpoplpush" | "blmpop"
    )
}

/// Redis's reply to `cmd`; a blocking command runs inside MULTI/EXEC, where
/// it never blocks (its queueing error, if any, is the reply).
fn redis_reply(redis: &mut Redis, cmd: &[Bytes]) -> Frame {
    if !is_blocking(cmd) {
        return redis.call(cmd);
    }
    assert_eq!(redis.call(&args(&["MULTI"])), Frame::ok());
    let queued = redis.call(cmd);
    let exec = redis.call(&args(&["EXEC"]));
    match (queued, exec) {
        (Frame::Simple(q), Frame::Array(mut items)) if q == "QUEUED" && items.len() == 1 => {
            items.remove(0)
        }
        (err @ Frame::Error(_), _) => err,
        (q, e) => panic!("MULTI {}: queued {q:?}, exec {e:?}", show(cmd)),
    }
}

fn check(redis: &mut Redis, seq: &[Vec<Bytes>]) -> Result<(), String> {
    redis.call(&args(&["FLUSHALL"]));
    let ours = Keyway::new();
    for (i, cmd) in seq.iter().enumerate() {
        let expected = redis_reply(redis, cmd);
        let got = ours.call(cmd, Protocol::Resp2);
        if expected != got {
            return Err(format!(
                "command {i} {}\n  redis:  {expected:?}\n  keyway: {got:?}",
                show(cmd)
            ));
        }
    }
    for key in KEYS.iter().chain([&STRING_KEY]) {
        for read in [
            args(&["TYPE", key]),
            args(&["LRANGE", key, "0", "-1"]),
            args(&["GET", key]),
        ] {
            let expected = normalize(redis.call(&read), Compare::Exact);
            let got = ours.call(&read, Protocol::Resp2);
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

#[test]
fn random_list_commands_match_redis_7() {
    let Some(redis) = Redis::start() else {
        eprintln!("diff_list: redis-server not available, skipped");
        return;
    };
    let redis = std::cell::RefCell::new(redis);
    let ops = std::cell::Cell::new(0u64);
    let n = cases(300);
    let mut runner = TestRunner::new(Config {
        cases: n,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = prop::collection::vec(list_command(), 1..100);
    let result = runner.run(&strategy, |seq| {
        ops.set(ops.get() + seq.len() as u64);
        check(&mut redis.borrow_mut(), &seq).map_err(TestCaseError::fail)
    });
    match result {
        Ok(()) => {}
        Err(TestError::Fail(why, seq)) => panic!(
            "diff_list: Keyway differs from Redis on this (shrunk) sequence:\n{}\n{why}",
            seq.iter().map(|c| show(c)).collect::<Vec<_>>().join("\n")
        ),
        Err(e) => panic!("diff_list: {e}"),
    }
    eprintln!("diff_list: {} random operations matched Redis", ops.get());
    assert!(
        ops.get() >= 10_000 || n < 300,
        "only {} operations",
        ops.get()
    );
}

#[test]
fn list_command_table_matches_redis_7() {
    let Some(mut redis) = Redis::start() else {
        eprintln!("diff_list: redis-server not available, skipped");
        return;
    };
    let version = redis.call(&args(&["INFO", "server"]));
    if !version
        .as_bytes()
        .is_some_and(|t| String::from_utf8_lossy(t).contains("redis_version:7.0."))
    {
        eprintln!("diff_list: not Redis 7.0, the command table is not compared");
        return;
    }
    let ours = Keyway::new();
    let mut failures = Vec::new();
    for getkeys in [
        "command getkeys lmove a b left right",
        "command getkeysandflags lmove a b left right",
        "command getkeysandflags rpoplpush a b",
        "command getkeys lmpop 2 a b left",
        "command getkeysandflags blmpop 0 2 a b left count 1",
        "command getkeys blpop a b c 0",
        "command getkeys brpoplpush a b 0",
        "command getkeys lmpop 0 a left",
        "command getkeys lmpop 5 a left",
    ] {
        let a = diff::tokenize(getkeys);
        let (expected, got) = (redis.call(&a), ours.call(&a, Protocol::Resp2));
        if expected != got {
            failures.push(format!(
                "{getkeys}\n  redis:  {expected:?}\n  keyway: {got:?}"
            ));
        }
    }
    redis.call(&args(&["HELLO", "3"]));
    for name in LIST_COMMANDS {
        let info = args(&["COMMAND", "INFO", name]);
        let (expected, got) = (redis.call(&info), ours.call(&info, Protocol::Resp3));
        if expected != got {
            failures.push(format!(
                "COMMAND INFO {name}\n  redis:  {expected:?}\n  keyway: {got:?}"
            ));
        }
        // DOCS without argument docs and history: the fields we report.
        let docs = args(&["COMMAND", "DOCS", name]);
        let (Frame::Map(expected), Frame::Map(got)) =
            (redis.call(&docs), ours.call(&docs, Protocol::Resp3))
        else {
            failures.push(format!("COMMAND DOCS {name}: not maps"));
            continue;
        };
        let (Some((_, Frame::Map(exp))), Some((_, Frame::Map(got)))) =
            (expected.first(), got.first())
        else {
            failures.push(format!("COMMAND DOCS {name}: empty"));
            continue;
        };
        for field in got {
            if !exp.contains(field) {
                failures.push(format!("COMMAND DOCS {name}: {field:?} not in Redis's"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
