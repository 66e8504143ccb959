//! Differential test of the stream commands against a real Redis 7: random
//! command sequences (proptest, shrunk on a mismatch) on two streams and a
//! string of one hash tag, every reply and the final state compared.
//! `KEYWAY_DIFF_LONG=1` runs ten times as many cases.
//!
//! Ids are explicit (`ms-seq`, `ms` or `ms-*`), never `*`, whose ids depend
//! on each server's clock. Idle times (XPENDING's extended form, XINFO
//! CONSUMERS' `idle`) are compared by shape or masked, and XCLAIM /
//! XAUTOCLAIM / XPENDING IDLE use idle thresholds no entry can be near
//! (0 or a day). XINFO STREAM FULL (delivery and seen times) and the radix
//! tree's sizes are left out.

mod diff;

use bytes::Bytes;
use diff::{Compare, Family, args, cases, run_family};
use proptest::prelude::*;

const KEYS: &[&str] = &["{s}a", "{s}b", "{s}str"];
const STREAMS: &[&str] = &["{s}a", "{s}b"];

fn s(v: &[&str]) -> BoxedStrategy<String> {
    prop::sample::select(v.iter().map(|x| x.to_string()).collect::<Vec<_>>()).boxed()
}

fn key() -> BoxedStrategy<String> {
    prop_oneof![8 => s(STREAMS), 1 => s(&["{s}str"])].boxed()
}

/// An XADD id.
fn add_id() -> BoxedStrategy<String> {
    prop_oneof![
        8 => (0u64..6, 0u64..4).prop_map(|(ms, seq)| format!("{ms}-{seq}")),
        3 => (0u64..6).prop_map(|ms| format!("{ms}-*")),
        2 => (0u64..6).prop_map(|ms| ms.to_string()),
        1 => s(&["0-0", "x", "-", "1-x", "18446744073709551615-18446744073709551615", "18446744073709551615-*", "01-1"]),
    ]
    .boxed()
}

/// An id argument to XDEL, XACK, XCLAIM, XSETID.
fn any_id() -> BoxedStrategy<String> {
    prop_oneof![
        8 => (0u64..6, 0u64..4).prop_map(|(ms, seq)| format!("{ms}-{seq}")),
        1 => (0u64..6).prop_map(|ms| ms.to_string()),
        1 => s(&["x", "+", "0-0", "18446744073709551615-18446744073709551615"]),
    ]
    .boxed()
}

/// A range bound.
fn bound() -> BoxedStrategy<String> {
    prop_oneof![
        3 => s(&["-", "+"]),
        4 => (0u64..6, 0u64..4).prop_map(|(ms, seq)| format!("{ms}-{seq}")),
        2 => (0u64..6).prop_map(|ms| ms.to_string()),
        2 => (0u64..6, 0u64..4).prop_map(|(ms, seq)| format!("({ms}-{seq}")),
        1 => s(&["(0-0", "(18446744073709551615-18446744073709551615", "(-", "x", "(3"]),
    ]
    .boxed()
}

fn group() -> BoxedStrategy<String> {
    s(&["g1", "g2", "nog"])
}

fn consumer() -> BoxedStrategy<String> {
    s(&["alice", "bob", "carol"])
}

fn count() -> BoxedStrategy<String> {
    s(&["1", "2", "3", "10", "0", "-1", "x"])
}

fn fields() -> BoxedStrategy<Vec<String>> {
    prop::collection::vec((s(&["f", "g", "item"]), s(&["1", "v", ""])), 1..3)
        .prop_map(|p| p.into_iter().flat_map(|(f, v)| [f, v]).collect())
        .boxed()
}

/// XADD's / XTRIM's trimming options.
fn trim_opts() -> BoxedStrategy<Vec<String>> {
    prop_oneof![
        4 => Just(vec![]),
        2 => (s(&["", "=", "~"]), s(&["0", "1", "2", "3", "-1", "x"])).prop_map(|(op, n)| {
            let mut v = vec!["maxlen".to_string()];
            if !op.is_empty() { v.push(op); }
            v.push(n);
            v
        }),
        2 => (s(&["", "=", "~"]), any_id()).prop_map(|(op, id)| {
            let mut v = vec!["minid".to_string()];
            if !op.is_empty() { v.push(op); }
            v.push(id);
            v
        }),
        1 => (s(&["~", "="]), s(&["1", "2"]), s(&["0", "1", "100", "-1"])).prop_map(|(op, n, l)| {
            vec!["maxlen".into(), op, n, "limit".into(), l]
        }),
        1 => s(&["limit 5", "maxlen 1 minid 1", "nomkstream"]).prop_map(|o| o.split(' ').map(String::from).collect()),
    ]
    .boxed()
}

fn stream_command() -> impl Strategy<Value = Vec<Bytes>> {
    prop_oneof![
        10 => (key(), any::<bool>(), trim_opts(), add_id(), fields()).prop_map(|(k, nomk, trim, id, f)| {
            let mut a = vec!["xadd".to_string(), k];
            if nomk { a.push("nomkstream".into()); }
            a.extend(trim);
            a.push(id);
            a.extend(f);
            a
        }),
        1 => (key(), add_id()).prop_map(|(k, id)| vec!["xadd".into(), k, id, "f".into()]),
        3 => (key(), prop::collection::vec(any_id(), 1..3)).prop_map(|(k, ids)| {
            let mut a = vec!["xdel".to_string(), k];
            a.extend(ids);
            a
        }),
        2 => (key(), trim_opts()).prop_map(|(k, t)| {
            let mut a = vec!["xtrim".to_string(), k];
            a.extend(t);
            a
        }),
        4 => (key(), any::<bool>(), bound(), bound(), prop::option::of(count())).prop_map(|(k, rev, a1, a2, c)| {
            let mut a = vec![if rev { "xrevrange" } else { "xrange" }.to_string(), k, a1, a2];
            if let Some(c) = c { a.push("count".into()); a.push(c); }
            a
        }),
        2 => key().prop_map(|k| vec!["xlen".into(), k]),
        3 => (prop::collection::vec((key(), s(&["0", "$", "1-0", "2", "3-1", ">", "x"])), 1..3), prop::option::of(count()))
            .prop_map(|(ks, c)| {
                let mut a = vec!["xread".to_string()];
                if let Some(c) = c { a.push("count".into()); a.push(c); }
                a.push("streams".into());
                a.extend(ks.iter().map(|(k, _)| k.clone()));
                a.extend(ks.into_iter().map(|(_, i)| i));
                a
            }),
        4 => (key(), group(), s(&["0", "$", "1-0", "3", "x"]), s(&["", "mkstream", "entriesread 2", "entriesread -2", "mkstream entriesread 1", "bogus"]))
            .prop_map(|(k, g, id, o)| {
                let mut a = vec!["xgroup".to_string(), "create".into(), k, g, id];
                a.extend(o.split(' ').filter(|x| !x.is_empty()).map(String::from));
                a
            }),
        2 => (key(), group(), s(&["0", "$", "2-0", "-", "x"]), s(&["", "entriesread 1", "entriesread -1"]))
            .prop_map(|(k, g, id, o)| {
                let mut a = vec!["xgroup".to_string(), "setid".into(), k, g, id];
                a.extend(o.split(' ').filter(|x| !x.is_empty()).map(String::from));
                a
            }),
        1 => (key(), group()).prop_map(|(k, g)| vec!["xgroup".into(), "destroy".into(), k, g]),
        2 => (key(), group(), consumer(), s(&["createconsumer", "delconsumer"]))
            .prop_map(|(k, g, c, sub)| vec!["xgroup".into(), sub, k, g, c]),
        8 => (key(), group(), consumer(), any::<bool>(), prop::option::of(count()), s(&[">", ">", "0", "2-0", "$"]))
            .prop_map(|(k, g, c, noack, n, id)| {
                let mut a = vec!["xreadgroup".to_string(), "group".into(), g, c];
                if noack { a.push("noack".into()); }
                if let Some(n) = n { a.push("count".into()); a.push(n); }
                a.extend(["streams".to_string(), k, id]);
                a
            }),
        3 => (key(), group(), prop::collection::vec(any_id(), 1..3)).prop_map(|(k, g, ids)| {
            let mut a = vec!["xack".to_string(), k, g];
            a.extend(ids);
            a
        }),
        3 => (key(), group(), prop::option::of((s(&["", "idle 0", "idle 86400000"]), bound(), bound(), count(), prop::option::of(consumer()))))
            .prop_map(|(k, g, ext)| {
                let mut a = vec!["xpending".to_string(), k, g];
                if let Some((idle, b1, b2, n, c)) = ext {
                    a.extend(idle.split(' ').filter(|x| !x.is_empty()).map(String::from));
                    a.extend([b1, b2, n]);
                    a.extend(c);
                }
                a
            }),
        3 => (key(), group(), consumer(), s(&["0", "86400000", "-5", "x"]), prop::collection::vec(any_id(), 1..3),
              s(&["", "justid", "force", "retrycount 5", "lastid 4-0", "force justid", "bogus", "idle 0"]))
            .prop_map(|(k, g, c, idle, ids, o)| {
                let mut a = vec!["xclaim".to_string(), k, g, c, idle];
                a.extend(ids);
                a.extend(o.split(' ').filter(|x| !x.is_empty()).map(String::from));
                a
            }),
        2 => (key(), group(), consumer(), s(&["0", "86400000", "x"]), bound(), s(&["", "count 1", "count 2 justid", "justid", "count 0", "bogus"]))
            .prop_map(|(k, g, c, idle, start, o)| {
                let mut a = vec!["xautoclaim".to_string(), k, g, c, idle, start];
                a.extend(o.split(' ').filter(|x| !x.is_empty()).map(String::from));
                a
            }),
        1 => (key(), any_id(), s(&["", "entriesadded 10", "entriesadded 0", "maxdeletedid 1-0", "maxdeletedid 9-0", "bogus 1"]))
            .prop_map(|(k, id, o)| {
                let mut a = vec!["xsetid".to_string(), k, id];
                a.extend(o.split(' ').filter(|x| !x.is_empty()).map(String::from));
                a
            }),
        2 => (key(), s(&["stream", "groups"])).prop_map(|(k, sub)| vec!["xinfo".into(), sub, k]),
        1 => (key(), group()).prop_map(|(k, g)| vec!["xinfo".into(), "consumers".into(), k, g]),
        1 => (key(), s(&["del", "type", "exists"])).prop_map(|(k, c)| vec![c, k]),
        1 => s(&["{s}str"]).prop_map(|k| vec!["set".into(), k, "v".into()]),
        1 => (key(), key()).prop_map(|(a, b)| vec!["copy".into(), a, b, "replace".into()]),
        1 => (key(), key()).prop_map(|(a, b)| vec!["rename".into(), a, b]),
    ]
    .prop_map(|a| a.into_iter().map(Bytes::from).collect())
}

const MASKED: &[&str] = &["radix-tree-keys", "radix-tree-nodes", "idle", "seen-time"];

fn compare(cmd: &[Bytes]) -> Compare {
    let name = String::from_utf8_lossy(&cmd[0]).to_ascii_lowercase();
    match name.as_str() {
        "xinfo" => Compare::Masked(MASKED),
        // The extended form's idle times.
        "xpending" if cmd.len() > 3 => Compare::Shape,
        _ => Compare::Exact,
    }
}

fn state(key: &str) -> Vec<Vec<Bytes>> {
    vec![
        args(&["XRANGE", key, "-", "+"]),
        args(&["XLEN", key]),
        args(&["XINFO", "STREAM", key]),
        args(&["XINFO", "GROUPS", key]),
        args(&["XPENDING", key, "g1"]),
        args(&["XPENDING", key, "g2"]),
        args(&["GET", key]),
    ]
}

#[test]
fn random_stream_commands_match_redis_7() {
    let family = Family {
        name: "diff_stream",
        keys: KEYS,
        compare: &compare,
        state: &state,
    };
    let strategy = prop::collection::vec(stream_command(), 1..60);
    if let Some(ops) = run_family(&family, strategy, cases(400)) {
        eprintln!("diff_stream: {ops} random operations matched Redis");
        assert!(ops >= 10_000 || cases(400) < 400, "only {ops} operations");
    }
}
