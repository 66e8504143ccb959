//! Differential test of the sorted-set commands against a real Redis 7, on
//! the shared harness (`tests/diff/`).
//!
//! proptest generates random sequences of sorted-set commands over a handful
//! of keys in one hash tag (small member alphabet; scores from a small set
//! with `inf`, `-inf`, `-0` and decimals; score, lex and rank ranges around
//! the edges, exclusive bounds included), runs each sequence on a private
//! `redis-server` and on `keyway_node::cmd` over a `MemEngine`, and requires
//! identical replies (after a RESP2 round trip) and identical final state
//! (`TYPE` and `ZRANGE k 0 -1 WITHSCORES` of every key). ZRANDMEMBER's
//! replies are random: only their shape is compared. On a mismatch proptest
//! shrinks the sequence and the test prints the smallest failing one.
//!
//! Default: 300 cases of 1 to 80 commands (about 12,000, counted, at least
//! 10,000 required); `KEYWAY_DIFF_LONG=1` runs ten times as many cases.
//! The blocking pops (BZPOPMIN BZPOPMAX BZMPOP) are compared in their
//! non-blocking form: Redis runs them inside `MULTI`/`EXEC` (where they never
//! block), Keyway runs `Command::execute` (what its MULTI and a blocking
//! attempt run).
//! Also: the sorted-set rows of the command table (`COMMAND INFO` in RESP3,
//! `COMMAND DOCS`, `COMMAND GETKEYS`) against Redis's.

mod diff;

use bytes::Bytes;
use diff::{Compare, Family, Keyway, Redis, args, cases, run_family, show};
use keyway_node::cmd;
use keyway_resp::{Frame, Protocol};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};

/// The last one also gets members of score 0 only (for lex ranges).
const KEYS: &[&str] = &["{z}a", "{z}b", "{z}c", "{z}l"];
const LEX_KEY: &str = "{z}l";
const STRING_KEY: &str = "{z}s";
/// A Redis set: the set-algebra commands read its members with score 1.
const SET_KEY: &str = "{z}set";
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

/// Range ends biased to give a non-empty interval: a low end (`lo`) and a
/// high end (`hi`), any bound a quarter of the time.
fn score_lo() -> impl Strategy<Value = String> {
    prop_oneof![3 => pick(&["-inf", "(-inf", "-1", "(-1", "0", "(0", "-0", "1", "(1", "-2.5"]), 1 => score_bound()]
}

fn score_hi() -> impl Strategy<Value = String> {
    prop_oneof![3 => pick(&["+inf", "inf", "(inf", "3", "(3", "100", "2", "(2", "1.5", "(1.5"]), 1 => score_bound()]
}

fn lex_lo() -> impl Strategy<Value = String> {
    prop_oneof![3 => pick(&["-", "[a", "(a", "[aa", "(ab", "[", "(", "[b"]), 1 => lex_bound()]
}

fn lex_hi() -> impl Strategy<Value = String> {
    prop_oneof![3 => pick(&["+", "[e", "(e", "[d", "(c", "[c", "(z"]), 1 => lex_bound()]
}

fn rank_lo() -> impl Strategy<Value = String> {
    prop_oneof![3 => pick(&["0", "1", "-3", "-2", "2"]), 1 => pick(RANKS)]
}

fn rank_hi() -> impl Strategy<Value = String> {
    prop_oneof![3 => pick(&["-1", "2", "3", "10", "-2"]), 1 => pick(RANKS)]
}

fn member() -> impl Strategy<Value = String> {
    pick(MEMBERS)
}

fn limit() -> impl Strategy<Value = Vec<String>> {
    prop_oneof![
        3 => Just(vec![]),
        2 => (pick(&["0", "0", "1", "2", "-1", "5"]), pick(&["0", "1", "2", "3", "-1", "-5", "10"]))
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
    prop::collection::vec(
        prop_oneof![4 => pick(KEYS), 1 => Just(SET_KEY.to_owned())],
        1..4,
    )
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
    let zadd_lex = prop::collection::vec(member(), 1..6).prop_map(|ms| {
        let mut a = vec!["ZADD".to_owned(), LEX_KEY.to_owned()];
        for m in ms {
            a.push("0".into());
            a.push(m);
        }
        a
    });
    let zadd = (
        key(),
        zadd_options(),
        prop::collection::vec((score(), member()), 1..6),
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
        30 => zadd,
        10 => zadd_lex,
        2 => (key(), score(), member()).prop_map(|(k, s, m)| vec!["ZINCRBY".into(), k, s, m]),
        2 => (key(), prop::collection::vec(member(), 1..4)).prop_map(|(k, ms)| join(vec!["ZREM".into(), k], ms)),
        1 => (key(), rank_lo(), rank_hi()).prop_map(|(k, a, b)| vec!["ZREMRANGEBYRANK".into(), k, a, b]),
        1 => (key(), score_lo(), score_hi()).prop_map(|(k, a, b)| vec!["ZREMRANGEBYSCORE".into(), k, a, b]),
        1 => (key(), lex_lo(), lex_hi()).prop_map(|(k, a, b)| vec!["ZREMRANGEBYLEX".into(), k, a, b]),
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
        1 => (key(), key(), rank_lo(), rank_hi(), pick(&["", "REV"])).prop_map(|(d, s, a, b, rev)| {
            let mut v = vec!["ZRANGESTORE".to_owned(), d, s, a, b];
            if !rev.is_empty() { v.push(rev.to_owned()); }
            v
        }),
        1 => (key(), key(), score_lo(), score_hi(), flag("REV"), limit()).prop_map(|(d, s, a, b, rev, l)| {
            let [a, b] = ends(a, b, !rev.is_empty());
            join(join(vec!["ZRANGESTORE".into(), d, s, a, b, "BYSCORE".into()], rev), l)
        }),
        1 => (key(), key(), lex_lo(), lex_hi(), flag("REV"), limit()).prop_map(|(d, s, a, b, rev, l)| {
            let [a, b] = ends(a, b, !rev.is_empty());
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
        1 => Just(vec!["DEL".to_owned(), STRING_KEY.to_owned()]),
        3 => prop::collection::vec(member(), 1..4).prop_map(|ms| join(vec!["SADD".into(), SET_KEY.into()], ms)),
        1 => member().prop_map(|m| vec!["SREM".into(), SET_KEY.into(), m]),
    ];
    let reads = prop_oneof![
        2 => (key(), member()).prop_map(|(k, m)| vec!["ZSCORE".into(), k, m]),
        1 => (key(), prop::collection::vec(member(), 1..4)).prop_map(|(k, ms)| join(vec!["ZMSCORE".into(), k], ms)),
        1 => key().prop_map(|k| vec!["ZCARD".into(), k]),
        2 => (pick(&["ZRANK", "ZREVRANK"]), key(), member()).prop_map(|(c, k, m)| vec![c, k, m]),
        2 => (key(), score_lo(), score_hi()).prop_map(|(k, a, b)| vec!["ZCOUNT".into(), k, a, b]),
        2 => (key(), lex_lo(), lex_hi()).prop_map(|(k, a, b)| vec!["ZLEXCOUNT".into(), k, a, b]),
        3 => (key(), rank_lo(), rank_hi(), flag("REV"), flag("WITHSCORES"), prop_oneof![4 => Just(vec![]), 1 => limit()])
            .prop_map(|(k, a, b, rev, ws, l)| join(join(join(vec!["ZRANGE".into(), k, a, b], rev), ws), l)),
        3 => (key(), score_lo(), score_hi(), flag("REV"), flag("WITHSCORES"), limit())
            .prop_map(|(k, a, b, rev, ws, l)| {
                let [a, b] = ends(a, b, !rev.is_empty());
                join(join(join(vec!["ZRANGE".into(), k, a, b, "BYSCORE".into()], rev), ws), l)
            }),
        3 => (key(), lex_lo(), lex_hi(), flag("REV"), limit(), prop_oneof![6 => Just(vec![]), 1 => Just(vec!["WITHSCORES".to_owned()])])
            .prop_map(|(k, a, b, rev, l, ws)| {
                let [a, b] = ends(a, b, !rev.is_empty());
                join(join(join(vec!["ZRANGE".into(), k, a, b, "BYLEX".into()], rev), l), ws)
            }),
        2 => (pick(&["ZRANGEBYSCORE", "ZREVRANGEBYSCORE"]), key(), score_lo(), score_hi(), flag("WITHSCORES"), limit())
            .prop_map(|(c, k, a, b, ws, l)| {
                let [a, b] = ends(a, b, c.starts_with("ZREV"));
                join(join(vec![c, k, a, b], ws), l)
            }),
        2 => (pick(&["ZRANGEBYLEX", "ZREVRANGEBYLEX"]), key(), lex_lo(), lex_hi(), limit())
            .prop_map(|(c, k, a, b, l)| {
                let [a, b] = ends(a, b, c.starts_with("ZREV"));
                join(vec![c, k, a, b], l)
            }),
        1 => (key(), rank_lo(), rank_hi(), flag("WITHSCORES")).prop_map(|(k, a, b, ws)| join(vec!["ZREVRANGE".into(), k, a, b], ws)),
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

/// `lo hi`, or `hi lo` when the command reads the range from the top (REV).
fn ends(lo: String, hi: String, rev: bool) -> [String; 2] {
    if rev { [hi, lo] } else { [lo, hi] }
}

#[test]
fn random_zset_commands_match_redis_7() {
    let mut keys: Vec<&str> = KEYS.to_vec();
    keys.push(STRING_KEY);
    keys.push(SET_KEY);
    let family = Family {
        name: "diff_zset",
        keys: &keys,
        compare: &|cmd: &[Bytes]| {
            if cmd[0].eq_ignore_ascii_case(b"zrandmember") {
                Compare::Shape
            } else if cmd[0].eq_ignore_ascii_case(b"smembers") {
                Compare::Unordered
            } else {
                Compare::Exact
            }
        },
        state: &|key: &str| {
            if key == SET_KEY {
                vec![args(&["SMEMBERS", key])]
            } else {
                vec![args(&["ZRANGE", key, "0", "-1", "WITHSCORES"])]
            }
        },
    };
    let strategy = prop::collection::vec(
        op().prop_map(|parts| {
            parts
                .into_iter()
                .map(|p| Bytes::copy_from_slice(p.as_bytes()))
                .collect::<Vec<Bytes>>()
        }),
        1..=80,
    );
    let cases = cases(300);
    if let Some(ops) = run_family(&family, strategy, cases) {
        eprintln!("diff_zset: {ops} commands matched Redis in {cases} sequences");
        assert!(ops >= 10_000 || cases < 300, "only {ops} commands ran");
    }
}

/// The sorted-set commands' `COMMAND INFO` (RESP3, exact) and `COMMAND DOCS`
/// fields (those Keyway reports) are Redis 7.0's.
#[test]
fn zset_command_table_matches_redis_7() {
    let Some(mut redis) = Redis::start() else {
        eprintln!("diff_zset: redis-server not available, skipped");
        return;
    };
    let version = redis.call(&args(&["INFO", "server"]));
    if !version
        .as_bytes()
        .is_some_and(|t| String::from_utf8_lossy(t).contains("redis_version:7.0."))
    {
        eprintln!("diff_zset: not Redis 7.0, command table not compared");
        return;
    }
    let ours = Keyway::new();
    let mut failures = Vec::new();
    for getkeys in [
        "command getkeys zunionstore d 2 a b weights 1 2",
        "command getkeysandflags zunionstore d 2 a b",
        "command getkeysandflags zrangestore d s 0 -1",
        "command getkeys zunion 2 a b withscores",
        "command getkeys zmpop 2 a b min",
        "command getkeys zintercard 3 a b",
        "command getkeys zdiffstore d 0 a",
        "command getkeysandflags zadd k 1 m",
        "command getkeys bzpopmin a b 0",
        "command getkeysandflags bzmpop 0 2 a b max",
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
    let names: Vec<&str> = cmd::table::commands()
        .iter()
        .filter(|c| c.group == "sorted-set")
        .map(|c| c.name)
        .collect();
    assert!(names.len() >= 32, "{names:?}");
    for name in &names {
        let info = [
            Bytes::from_static(b"COMMAND"),
            Bytes::from_static(b"INFO"),
            Bytes::copy_from_slice(name.as_bytes()),
        ];
        let (expected, got) = (redis.call(&info), ours.call(&info, Protocol::Resp3));
        if expected != got {
            failures.push(format!(
                "COMMAND INFO {name}\n  redis:  {expected:?}\n  keyway: {got:?}"
            ));
        }
        let docs = [
            Bytes::from_static(b"COMMAND"),
            Bytes::from_static(b"DOCS"),
            Bytes::copy_from_slice(name.as_bytes()),
        ];
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

/// A blocking pop, or a write that feeds one.
fn blocking_op() -> impl Strategy<Value = Vec<String>> {
    let timeout = || pick(&["0", "0.5", "1", "-1", "x", "0.001"]);
    prop_oneof![
        4 => (key(), prop::collection::vec((pick(SCORES), member()), 1..4)).prop_map(|(k, pairs)| {
            let mut a = vec!["ZADD".to_owned(), k];
            for (sc, m) in pairs {
                a.push(sc);
                a.push(m);
            }
            a
        }),
        1 => (key(), member()).prop_map(|(k, m)| vec!["ZREM".into(), k, m]),
        3 => (pick(&["BZPOPMIN", "BZPOPMAX"]), sources(), timeout()).prop_map(|(c, keys, t)| {
            let mut a = vec![c];
            a.extend(keys);
            a.push(t);
            a
        }),
        3 => (timeout(), sources(), pick(&["MIN", "MAX", "mid"]), prop_oneof![Just(vec![]), pick(&["1", "2", "10", "0"]).prop_map(|n| vec!["COUNT".into(), n])])
            .prop_map(|(t, keys, w, count)| {
                let mut a = vec!["BZMPOP".to_owned(), t, keys.len().to_string()];
                a.extend(keys);
                a.push(w);
                a.extend(count);
                a
            }),
        1 => Just(vec!["SET".to_owned(), STRING_KEY.to_owned(), "v".to_owned()]),
        1 => Just(vec!["DEL".to_owned(), STRING_KEY.to_owned()]),
    ]
}

/// Redis's reply to `cmd`; a blocking pop runs inside MULTI/EXEC, where it
/// never blocks (its queueing error, if any, is the reply).
fn redis_reply(redis: &mut Redis, cmd: &[Bytes]) -> Frame {
    if !cmd[0].starts_with(b"BZ") {
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

fn check_blocking(redis: &mut Redis, seq: &[Vec<Bytes>]) -> Result<(), String> {
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
    for key in KEYS {
        let read = args(&["ZRANGE", key, "0", "-1", "WITHSCORES"]);
        let (expected, got) = (redis.call(&read), ours.call(&read, Protocol::Resp2));
        if expected != got {
            return Err(format!(
                "final state {}\n  redis:  {expected:?}\n  keyway: {got:?}",
                show(&read)
            ));
        }
    }
    Ok(())
}

#[test]
fn blocking_pops_match_redis_7_in_multi() {
    let Some(redis) = Redis::start() else {
        eprintln!("diff_zset: redis-server not available, skipped");
        return;
    };
    let redis = std::cell::RefCell::new(redis);
    let mut runner = TestRunner::new(Config {
        cases: cases(100),
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = prop::collection::vec(
        blocking_op().prop_map(|parts| parts.into_iter().map(Bytes::from).collect::<Vec<Bytes>>()),
        1..40,
    );
    let result = runner.run(&strategy, |seq| {
        check_blocking(&mut redis.borrow_mut(), &seq).map_err(TestCaseError::fail)
    });
    match result {
        Ok(()) => {}
        Err(TestError::Fail(why, seq)) => panic!(
            "diff_zset: Keyway differs from Redis on this (shrunk) sequence:\n{}\n{why}",
            seq.iter().map(|c| show(c)).collect::<Vec<_>>().join("\n")
        ),
        Err(e) => panic!("diff_zset: {e}"),
    }
}
