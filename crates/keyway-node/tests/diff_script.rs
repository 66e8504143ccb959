//! Differential test of Lua scripting against a real Redis 7: random
//! scripts (statements drawn from `redis.call`/`redis.pcall` on the
//! script's keys, local arithmetic, error and status replies, runtime
//! errors) run with EVAL, EVAL_RO and EVALSHA after SCRIPT LOAD on a Redis
//! in cluster mode (one slot per script, as Keyway), between
//! plain commands on the same keys; every reply (errors with their
//! `script: <sha>, on @user_script:<line>.` suffix included) and the final
//! state compared. `KEYWAY_DIFF_LONG=1` runs ten times as many cases.

mod diff;

use bytes::Bytes;
use diff::{Compare, Family, Redis, args, cases, run_family_on};
use proptest::prelude::*;

const KEYS: &[&str] = &["{s}a", "{s}b"];

/// One statement of a script body (KEYS[1], KEYS[2], ARGV[1] in scope).
fn statement() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "redis.call('set', KEYS[1], ARGV[1])",
        "redis.call('incr', KEYS[2])",
        "redis.call('incrby', KEYS[2], 5)",
        "redis.pcall('incr', KEYS[1])",
        "redis.call('del', KEYS[1])",
        "redis.call('hset', KEYS[1], 'f', ARGV[1])",
        "redis.call('rpush', KEYS[2], ARGV[1], 'x')",
        "redis.call('expire', KEYS[1], 100)",
        "local v = redis.call('get', KEYS[1])",
        "local n = #KEYS + #ARGV",
        "local t = redis.call('lrange', KEYS[2], 0, -1)",
        "local e = redis.pcall('nosuch')",
    ])
}

/// How a script ends.
fn ending() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "return redis.call('get', KEYS[1])",
        "return redis.call('incr', KEYS[1])",
        "return {redis.call('exists', KEYS[1]), ARGV[1], redis.call('type', KEYS[2])}",
        "return redis.call('lrange', KEYS[2], 0, -1)",
        "return redis.call('hgetall', KEYS[1])",
        "return redis.pcall('incr', KEYS[1])",
        "return redis.status_reply('FINE')",
        "return redis.error_reply('MYERR went wrong')",
        "return redis.error_reply('plain')",
        "return nil",
        "return true",
        "return false",
        "return 3.99",
        "return -7",
        "return tonumber(ARGV[1])",
        "return {1, 2, {3, 'four'}, nil, 5}",
        "return redis.call('ttl', KEYS[1]) > 0",
        "return undefined_global",
        "return 1 + nil",
        "error('custom failure')",
        "x = 5",
        "return redis.call('set', KEYS[1])",
        "return redis.sha1hex(ARGV[1])",
        "return string.rep(ARGV[1], 2) .. math.floor(2.5)",
        "return table.concat({ARGV[1], 'y'}, '-')",
    ])
}

/// Scripts that touch no key.
fn pure() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "return 1",
        "return {1, 'two', {3}}",
        "return redis.status_reply('PONG')",
        "return redis.error_reply('ERR nope')",
        "return nil",
        "local x = 1 + nil",
        "return redis.call('nosuch')",
        "return redis.pcall()",
        "return #KEYS",
        "return y",
    ])
}

fn script() -> impl Strategy<Value = String> {
    (prop::collection::vec(statement(), 0..4), ending()).prop_map(|(body, end)| {
        let mut lines: Vec<&str> = body;
        lines.push(end);
        lines.join("\n")
    })
}

fn value() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["1", "-2", "abc", "", "10.5"])
}

fn command() -> impl Strategy<Value = Vec<Vec<Bytes>>> {
    let key = prop::sample::select(KEYS.to_vec());
    prop_oneof![
        6 => (script(), value()).prop_map(|(s, v)| vec![args(&["EVAL", &s, "2", "{s}a", "{s}b", v])]),
        2 => (script(), value()).prop_map(|(s, v)| vec![args(&["EVAL_RO", &s, "2", "{s}a", "{s}b", v])]),
        2 => (script(), value()).prop_map(|(s, v)| {
            let sha = keyway_node::script::sha1_hex(s.as_bytes());
            vec![
                args(&["SCRIPT", "LOAD", &s]),
                args(&["EVALSHA", &sha, "2", "{s}a", "{s}b", v]),
                args(&["SCRIPT", "EXISTS", &sha, "0000000000000000000000000000000000000000"]),
            ]
        }),
        // Without keys (Keyway lets such a script touch no key at all).
        1 => pure().prop_map(|s| vec![args(&["EVAL", s, "0"])]),
        1 => prop::sample::select(vec!["-1", "3", "x"]).prop_map(|n| vec![args(&["EVAL", "return 1", n, "{s}a"])]),
        2 => (key.clone(), value()).prop_map(|(k, v)| vec![args(&["SET", k, v])]),
        1 => key.clone().prop_map(|k| vec![args(&["DEL", k])]),
        1 => key.prop_map(|k| vec![args(&["GET", k])]),
    ]
}

fn compare(cmd: &[Bytes]) -> Compare {
    match String::from_utf8_lossy(&cmd[0])
        .to_ascii_lowercase()
        .as_str()
    {
        // TTL in the final state may tick between the two servers.
        "ttl" => Compare::Shape,
        _ => Compare::Exact,
    }
}

fn state(key: &str) -> Vec<Vec<Bytes>> {
    vec![
        args(&["GET", key]),
        args(&["HGETALL", key]),
        args(&["LRANGE", key, "0", "-1"]),
    ]
}

#[test]
fn random_scripts_match_redis_7() {
    let family = Family {
        name: "diff_script",
        keys: KEYS,
        compare: &compare,
        state: &state,
    };
    let strategy = prop::collection::vec(command(), 1..30)
        .prop_map(|groups| groups.into_iter().flatten().collect());
    // Against Redis in cluster mode, as Keyway runs scripts (one slot).
    if let Some(ops) = run_family_on(Redis::start_cluster, &family, strategy, cases(600)) {
        eprintln!("diff_script: {ops} random operations matched Redis");
        assert!(ops >= 10_000 || cases(600) < 600, "only {ops} operations");
    }
}
