//! Differential test of the set commands against a real Redis 7: random
//! command sequences (proptest, shrunk on a mismatch) on a few sets of one
//! hash tag, every reply and the final state compared. `KEYWAY_DIFF_LONG=1`
//! runs ten times as many cases.

mod diff;

use bytes::Bytes;
use diff::{Compare, Family, args, cases, run_family};
use proptest::prelude::*;

const KEYS: &[&str] = &["{s}a", "{s}b", "{s}c", "{s}str"];

fn member() -> impl Strategy<Value = String> {
    prop::sample::select(vec!["1", "2", "3", "a", "b", "", "-5", "10", "ünï", "x:y"])
        .prop_map(String::from)
}

fn key() -> impl Strategy<Value = String> {
    prop::sample::select(KEYS.to_vec()).prop_map(String::from)
}

fn count() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "-3",
        "0",
        "1",
        "2",
        "5",
        "100",
        "x",
        "-9223372036854775808",
        "9223372036854775807",
    ])
    .prop_map(String::from)
}

fn set_command() -> impl Strategy<Value = Vec<Bytes>> {
    prop_oneof![
        5 => (key(), prop::collection::vec(member(), 1..5)).prop_map(|(k, ms)| [vec!["sadd".to_string(), k], ms].concat()),
        3 => (key(), prop::collection::vec(member(), 1..4)).prop_map(|(k, ms)| [vec!["srem".to_string(), k], ms].concat()),
        2 => (key(), member(), prop::sample::select(vec!["sismember"])).prop_map(|(k, m, c)| vec![c.into(), k, m]),
        1 => (key(), prop::collection::vec(member(), 1..4)).prop_map(|(k, ms)| [vec!["smismember".to_string(), k], ms].concat()),
        2 => (key(), prop::sample::select(vec!["scard", "smembers", "type", "exists", "del", "srandmember"]))
            .prop_map(|(k, c)| vec![c.into(), k]),
        2 => (key(), count()).prop_map(|(k, n)| vec!["srandmember".into(), k, n]),
        // SPOP only where its choice does not matter (all, none, errors):
        // a random removal would make the two states differ.
        1 => (key(), prop::sample::select(vec!["0", "-3", "x", "100", "9223372036854775807"]))
            .prop_map(|(k, n)| vec!["spop".into(), k, n.into()]),
        1 => (key(), count(), count()).prop_map(|(k, a, b)| vec!["spop".into(), k, a, b]),
        2 => (key(), key(), member()).prop_map(|(a, b, m)| vec!["smove".into(), a, b, m]),
        3 => (prop::sample::select(vec!["sinter", "sunion", "sdiff", "sinterstore", "sunionstore", "sdiffstore"]),
              prop::collection::vec(key(), 1..4)).prop_map(|(c, ks)| [vec![c.to_string()], ks].concat()),
        1 => (prop::collection::vec(key(), 1..4), prop::sample::select(vec!["", "limit 1", "limit 0", "limit -1", "limit x", "bogus", "limit"]), any::<u8>())
            .prop_map(|(ks, opt, n)| {
                let numkeys = match n % 5 { 0 => "0".to_string(), 1 => (ks.len() + 1).to_string(), 2 => "x".into(), _ => ks.len().to_string() };
                let mut a = vec!["sintercard".to_string(), numkeys];
                a.extend(ks);
                a.extend(opt.split(' ').filter(|s| !s.is_empty()).map(String::from));
                a
            }),
        1 => (key(), prop::sample::select(vec!["0", "x", "+", ""]), prop::sample::select(vec!["", "count 100", "match 1*", "count 0", "match", "count x"]))
            .prop_map(|(k, c, opts)| {
                let mut a = vec!["sscan".to_string(), k, c.into()];
                a.extend(opts.split(' ').filter(|s| !s.is_empty()).map(String::from));
                a
            }),
        1 => member().prop_map(|v| vec!["set".into(), "{s}str".into(), v]),
    ]
    .prop_map(|a| a.into_iter().map(Bytes::from).collect())
}

fn compare(cmd: &[Bytes]) -> Compare {
    let name = String::from_utf8_lossy(&cmd[0]).to_ascii_lowercase();
    match name.as_str() {
        "smembers" | "sinter" | "sunion" | "sdiff" => Compare::Unordered,
        "spop" | "srandmember" => Compare::Shape,
        "sscan" => Compare::ScanMembers,
        _ => Compare::Exact,
    }
}

fn state(key: &str) -> Vec<Vec<Bytes>> {
    vec![args(&["SMEMBERS", key]), args(&["SCARD", key])]
}

#[test]
fn random_set_commands_match_redis_7() {
    let family = Family {
        name: "diff_set",
        keys: KEYS,
        compare: &compare,
        state: &state,
    };
    let strategy = prop::collection::vec(set_command(), 1..60);
    if let Some(ops) = run_family(&family, strategy, cases(400)) {
        eprintln!("diff_set: {ops} random operations matched Redis");
        assert!(ops >= 10_000 || cases(400) < 400, "only {ops} operations");
    }
}

#[test]
fn a_scan_is_compared_whole_not_by_where_its_first_page_ends() {
    // Found by the random test (stop 32): after these, Redis 7.0 answered
    // the SSCAN with cursor 7 and both matches (its hash table was
    // rehashing), Keyway with cursor 0 and the same matches. Both are
    // right; the scans, followed to their ends, return the same members.
    // The last SSCAN (COUNT 1) always ends its first page early on both,
    // at cursors that depend on each one's layout (Redis: a hash-table
    // bucket), so comparing first pages could never pass it.
    let Some(mut redis) = diff::Redis::start() else {
        eprintln!("redis-server not available, skipped");
        return;
    };
    let family = Family {
        name: "diff_set",
        keys: KEYS,
        compare: &compare,
        state: &state,
    };
    let seq: Vec<Vec<Bytes>> = [
        &["sadd", "{s}b", "x:y", "ünï", "3"][..],
        &["sinterstore", "{s}c", "{s}b"],
        &["sadd", "{s}c", "2"],
        &["sadd", "{s}c", "a", "10", ""],
        &["sadd", "{s}c", "b", "-5", "1"],
        &["sscan", "{s}c", "0", "match", "1*"],
        &["sscan", "{s}c", "0", "count", "1"],
    ]
    .iter()
    .map(|c| args(c))
    .collect();
    diff::check_sequence(&mut redis, &family, &seq).unwrap();
}
