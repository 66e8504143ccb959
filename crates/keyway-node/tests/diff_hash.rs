//! Differential test of the hash commands against a real Redis 7: random
//! command sequences (proptest, shrunk on a mismatch) on a few hashes of one
//! hash tag, every reply and the final state compared. `KEYWAY_DIFF_LONG=1`
//! runs ten times as many cases.

mod diff;

use bytes::Bytes;
use diff::{Compare, Family, args, cases, run_family};
use proptest::prelude::*;

const KEYS: &[&str] = &["{h}a", "{h}b", "{h}s"];

fn field() -> impl Strategy<Value = String> {
    prop::sample::select(vec!["f", "g", "h", "", "field:1", "field:2", "ünï"])
        .prop_map(String::from)
}

fn value() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "1",
        "-2",
        "0",
        "10.5",
        "x",
        "",
        "9223372036854775807",
        "-9223372036854775808",
        "1e3",
        " 1",
        "3.0",
    ])
    .prop_map(String::from)
}

fn incr() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "1",
        "-1",
        "100",
        "x",
        "1.5",
        "9223372036854775807",
        "-9223372036854775808",
        "inf",
        "nan",
        "-0.25",
        "1e2",
        "",
    ])
    .prop_map(String::from)
}

fn hash_command() -> impl Strategy<Value = Vec<Bytes>> {
    let key = prop::sample::select(KEYS.to_vec());
    prop_oneof![
        4 => (key.clone(), prop::collection::vec((field(), value()), 1..4)).prop_map(|(k, pairs)| {
            let mut a = vec!["hset".to_string(), k.to_string()];
            for (f, v) in pairs {
                a.push(f);
                a.push(v);
            }
            a
        }),
        1 => (key.clone(), field(), value()).prop_map(|(k, f, v)| vec!["hmset".into(), k.into(), f, v]),
        1 => (key.clone(), field()).prop_map(|(k, f)| vec!["hset".into(), k.into(), f]),
        1 => (key.clone(), field(), value()).prop_map(|(k, f, v)| vec!["hsetnx".into(), k.into(), f, v]),
        2 => (key.clone(), field(), prop::sample::select(vec!["hget", "hstrlen", "hexists"]))
            .prop_map(|(k, f, c)| vec![c.into(), k.into(), f]),
        1 => (key.clone(), prop::collection::vec(field(), 1..4)).prop_map(|(k, fs)| {
            let mut a = vec!["hmget".to_string(), k.into()];
            a.extend(fs);
            a
        }),
        2 => (key.clone(), prop::collection::vec(field(), 1..3)).prop_map(|(k, fs)| {
            let mut a = vec!["hdel".to_string(), k.into()];
            a.extend(fs);
            a
        }),
        2 => (key.clone(), prop::sample::select(vec!["hlen", "hkeys", "hvals", "hgetall", "type", "exists", "del"]))
            .prop_map(|(k, c)| vec![c.into(), k.into()]),
        2 => (key.clone(), field(), incr(), prop::sample::select(vec!["hincrby", "hincrbyfloat"]))
            .prop_map(|(k, f, by, c)| vec![c.into(), k.into(), f, by]),
        1 => (key.clone(), prop::sample::select(vec!["-5", "0", "2", "10", "x", "-9223372036854775808"]), any::<u8>())
            .prop_map(|(k, n, w)| {
                let mut a = vec!["hrandfield".to_string(), k.into(), n.into()];
                match w % 4 {
                    0 => a.push("withvalues".into()),
                    1 => a.push("bogus".into()),
                    _ => {}
                }
                a
            }),
        1 => key.clone().prop_map(|k| vec!["hrandfield".into(), k.into()]),
        1 => (key.clone(), prop::sample::select(vec!["0", "x", "-1"]), prop::sample::select(vec!["", "count 100", "match f*", "count 0", "match"]))
            .prop_map(|(k, c, opts)| {
                let mut a = vec!["hscan".to_string(), k.into(), c.into()];
                a.extend(opts.split(' ').filter(|s| !s.is_empty()).map(String::from));
                a
            }),
        1 => (key.clone(), value()).prop_map(|(k, v)| vec!["set".into(), k.into(), v]),
        1 => key.prop_map(|k| vec!["get".into(), k.into()]),
    ]
    .prop_map(|a| a.into_iter().map(Bytes::from).collect())
}

fn compare(cmd: &[Bytes]) -> Compare {
    let name = String::from_utf8_lossy(&cmd[0]).to_ascii_lowercase();
    match name.as_str() {
        "hkeys" | "hvals" => Compare::Unordered,
        "hgetall" => Compare::UnorderedPairs,
        "hrandfield" => Compare::Shape,
        "hscan" => Compare::ScanPairs,
        _ => Compare::Exact,
    }
}

fn state(key: &str) -> Vec<Vec<Bytes>> {
    vec![args(&["HGETALL", key]), args(&["GET", key])]
}

#[test]
fn random_hash_commands_match_redis_7() {
    let family = Family {
        name: "diff_hash",
        keys: KEYS,
        compare: &compare,
        state: &state,
    };
    let strategy = prop::collection::vec(hash_command(), 1..60);
    if let Some(ops) = run_family(&family, strategy, cases(400)) {
        eprintln!("diff_hash: {ops} random operations matched Redis");
        assert!(ops >= 10_000 || cases(400) < 400, "only {ops} operations");
    }
}
