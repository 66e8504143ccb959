//! Unit tests of the sorted-set commands over the in-memory engine.

use super::super::testing::*;
use keyway_resp::Frame;

fn arr(items: &[&str]) -> Frame {
    Frame::Array(items.iter().map(|s| bulk(s)).collect())
}

#[test]
fn zadd_flags_and_replies() {
    let mut t = TestDb::new();
    assert_eq!(t.run(&["zadd", "z", "1", "a", "2", "b"]), int(2));
    assert_eq!(
        t.run(&["zadd", "z", "xx", "ch", "5", "a", "7", "c"]),
        int(1)
    );
    assert_eq!(t.run(&["zadd", "z", "nx", "9", "a", "3", "c"]), int(1));
    assert_eq!(
        t.run(&["zadd", "z", "gt", "ch", "4", "a", "9", "b"]),
        int(1)
    );
    assert_eq!(t.run(&["zadd", "z", "lt", "ch", "1", "a"]), int(1));
    assert_eq!(
        t.run(&["zrange", "z", "0", "-1", "withscores"]),
        arr(&["a", "1", "c", "3", "b", "9"])
    );
    assert_eq!(t.run(&["zadd", "z", "incr", "1.5", "a"]), bulk("2.5"));
    assert_eq!(t.run(&["zadd", "z", "nx", "incr", "1", "a"]), Frame::Null);
    assert_eq!(
        t.run(&["zincrby", "z", "0.1", "a"]),
        bulk("2.6000000000000001")
    );
    assert_eq!(t.run(&["zadd", "nokey", "xx", "1", "a"]), int(0));
    assert_eq!(t.run(&["exists", "nokey"]), int(0));
    assert_eq!(
        t.run(&["zadd", "z", "nx", "xx", "1", "a"]),
        err("ERR XX and NX options at the same time are not compatible")
    );
    assert_eq!(
        t.run(&["zadd", "z", "gt", "lt", "1", "a"]),
        err("ERR GT, LT, and/or NX options at the same time are not compatible")
    );
    assert_eq!(
        t.run(&["zadd", "z", "incr", "1", "a", "2", "b"]),
        err("ERR INCR option supports a single increment-element pair")
    );
    assert_eq!(t.run(&["zadd", "z", "nx", "1"]), err("ERR syntax error"));
    assert_eq!(
        t.run(&["zadd", "z", "x", "a"]),
        err("ERR value is not a valid float")
    );
    assert_eq!(
        t.run(&["zadd", "z", "nan", "a"]),
        err("ERR value is not a valid float")
    );
    assert_eq!(t.run(&["zincrby", "z", "nx", "a"]), err("ERR syntax error"));
    t.run(&["zadd", "i", "inf", "a"]);
    assert_eq!(
        t.run(&["zincrby", "i", "-inf", "a"]),
        err("ERR resulting score is not a number (NaN)")
    );
    assert_eq!(t.run(&["zscore", "i", "a"]), bulk("inf"));
    t.run(&["set", "s", "x"]);
    assert_eq!(
        t.run(&["zadd", "s", "1", "a"]),
        err("WRONGTYPE Operation against a key holding the wrong kind of value")
    );
}

#[test]
fn negative_zero_is_stored_as_zero_but_replied_as_computed() {
    let mut t = TestDb::new();
    t.run(&["zadd", "z", "-0", "b", "0", "a", "-1", "c"]);
    assert_eq!(t.run(&["zscore", "z", "b"]), bulk("0"));
    assert_eq!(
        t.run(&["zrange", "z", "0", "-1", "withscores"]),
        arr(&["c", "-1", "a", "0", "b", "0"])
    );
    assert_eq!(t.run(&["zincrby", "z", "-0", "new"]), bulk("-0"));
    assert_eq!(t.run(&["zscore", "z", "new"]), bulk("0"));
    assert_eq!(
        t.run(&["zunion", "1", "z", "weights", "-1", "withscores"]),
        arr(&["a", "-0", "b", "-0", "new", "-0", "c", "1"])
    );
}

#[test]
fn ranges_by_rank_score_and_lex() {
    let mut t = TestDb::new();
    t.run(&[
        "zadd", "z", "1", "a", "2", "b", "3", "c", "4", "d", "5", "e",
    ]);
    assert_eq!(t.run(&["zrange", "z", "1", "-2"]), arr(&["b", "c", "d"]));
    assert_eq!(t.run(&["zrevrange", "z", "0", "1"]), arr(&["e", "d"]));
    assert_eq!(t.run(&["zrange", "z", "3", "1"]), arr(&[]));
    assert_eq!(
        t.run(&["zrange", "z", "(1", "3", "byscore"]),
        arr(&["b", "c"])
    );
    assert_eq!(
        t.run(&[
            "zrange", "z", "+inf", "(2", "byscore", "rev", "limit", "1", "2"
        ]),
        arr(&["d", "c"])
    );
    assert_eq!(
        t.run(&["zrangebyscore", "z", "-inf", "+inf", "limit", "-1", "2"]),
        arr(&[])
    );
    assert_eq!(
        t.run(&["zrangebyscore", "z", "-inf", "+inf", "limit", "3", "-5"]),
        arr(&["d", "e"])
    );
    assert_eq!(
        t.run(&["zrangebyscore", "z", "x", "1"]),
        err("ERR min or max is not a float")
    );
    assert_eq!(
        t.run(&["zrange", "z", "0", "1", "limit", "0", "1"]),
        err(
            "ERR syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX"
        )
    );
    assert_eq!(
        t.run(&["zrange", "z", "0", "1", "limit", "5", "-1"]),
        arr(&["a", "b"])
    );
    assert_eq!(t.run(&["zcount", "z", "(1", "(5"]), int(3));
    t.run(&["zadd", "l", "0", "a", "0", "b", "0", "c", "0", "d"]);
    assert_eq!(t.run(&["zrangebylex", "l", "[b", "(d"]), arr(&["b", "c"]));
    assert_eq!(
        t.run(&["zrevrangebylex", "l", "+", "(b", "limit", "1", "5"]),
        arr(&["c"])
    );
    assert_eq!(
        t.run(&["zrange", "l", "-", "+", "bylex", "withscores"]),
        err("ERR syntax error, WITHSCORES not supported in combination with BYLEX")
    );
    assert_eq!(t.run(&["zlexcount", "l", "-", "[c"]), int(3));
    assert_eq!(
        t.run(&["zlexcount", "l", "a", "+"]),
        err("ERR min or max not valid string range item")
    );
    assert_eq!(
        t.run(&["zrangestore", "dst", "l", "(a", "+", "bylex"]),
        int(3)
    );
    assert_eq!(t.run(&["zrange", "dst", "0", "-1"]), arr(&["b", "c", "d"]));
    assert_eq!(t.run(&["zrangestore", "dst", "l", "5", "9"]), int(0));
    assert_eq!(t.run(&["exists", "dst"]), int(0));
}

#[test]
fn removals_pops_and_ranks() {
    let mut t = TestDb::new();
    t.run(&[
        "zadd", "z", "1", "a", "2", "b", "3", "c", "4", "d", "5", "e",
    ]);
    assert_eq!(t.run(&["zrank", "z", "d"]), int(3));
    assert_eq!(t.run(&["zrevrank", "z", "d"]), int(1));
    assert_eq!(t.run(&["zrank", "z", "x"]), Frame::Null);
    assert_eq!(t.run(&["zpopmax", "z"]), arr(&["e", "5"]));
    assert_eq!(t.run(&["zpopmin", "z", "2"]), arr(&["a", "1", "b", "2"]));
    assert_eq!(
        t.run(&["zpopmin", "z", "-1"]),
        err("ERR value is out of range, must be positive")
    );
    assert_eq!(
        t.run(&["zmpop", "2", "none", "z", "max", "count", "5"]),
        Frame::Array(vec![
            bulk("z"),
            Frame::Array(vec![arr(&["d", "4"]), arr(&["c", "3"])]),
        ])
    );
    assert_eq!(t.run(&["exists", "z"]), int(0));
    assert_eq!(t.run(&["zmpop", "1", "z", "min"]), Frame::NullArray);
    assert_eq!(
        t.run(&["zmpop", "0", "z", "min"]),
        err("ERR numkeys should be greater than 0")
    );
    t.run(&[
        "zadd", "z", "1", "a", "2", "b", "3", "c", "4", "d", "5", "e",
    ]);
    assert_eq!(t.run(&["zremrangebyrank", "z", "1", "2"]), int(2));
    assert_eq!(t.run(&["zremrangebyscore", "z", "(1", "+inf"]), int(2));
    assert_eq!(t.run(&["zrem", "z", "a", "zz"]), int(1));
    assert_eq!(t.run(&["type", "z"]), Frame::Simple("none".into()));
}

#[test]
fn set_algebra_with_sets_and_weights() {
    let mut t = TestDb::new();
    t.run(&["zadd", "{t}a", "1", "x", "2", "y"]);
    t.run(&["zadd", "{t}b", "10", "y", "20", "z"]);
    assert_eq!(
        t.run(&["zunion", "2", "{t}a", "{t}b", "withscores"]),
        arr(&["x", "1", "y", "12", "z", "20"])
    );
    assert_eq!(
        t.run(&[
            "zinter",
            "2",
            "{t}a",
            "{t}b",
            "weights",
            "2",
            "0.5",
            "aggregate",
            "max",
            "withscores"
        ]),
        arr(&["y", "5"])
    );
    assert_eq!(t.run(&["zdiff", "2", "{t}a", "{t}b"]), arr(&["x"]));
    assert_eq!(
        t.run(&["zintercard", "2", "{t}a", "{t}b", "limit", "0"]),
        int(1)
    );
    assert_eq!(
        t.run(&[
            "zunionstore",
            "{t}d",
            "2",
            "{t}a",
            "{t}b",
            "aggregate",
            "min"
        ]),
        int(3)
    );
    assert_eq!(
        t.run(&["zrange", "{t}d", "0", "-1", "withscores"]),
        arr(&["x", "1", "y", "2", "z", "20"])
    );
    assert_eq!(
        t.run(&["zunion", "0", "{t}a"]),
        err("ERR at least 1 input key is needed for 'zunion' command")
    );
    assert_eq!(t.run(&["zunion", "3", "{t}a"]), err("ERR syntax error"));
    assert_eq!(
        t.run(&["zunion", "1", "{t}a", "weights", "x"]),
        err("ERR weight value is not a float")
    );
    assert_eq!(
        t.run(&["zintercard", "1", "{t}a", "limit", "-1"]),
        err("ERR LIMIT can't be negative")
    );
    t.run(&["set", "{t}s", "v"]);
    assert_eq!(
        t.run(&["zunion", "2", "{t}a", "{t}s", "bogus"]),
        err("WRONGTYPE Operation against a key holding the wrong kind of value")
    );
    assert_eq!(
        t.run(&["zinterstore", "{t}d", "2", "{t}a", "{t}none"]),
        int(0)
    );
    assert_eq!(t.run(&["exists", "{t}d"]), int(0));
}

#[test]
fn zscan_small_and_chunked() {
    let mut t = TestDb::new();
    t.run(&["zadd", "z", "2", "a", "1", "b"]);
    assert_eq!(
        t.run(&["zscan", "z", "0"]),
        Frame::Array(vec![bulk("0"), arr(&["b", "1", "a", "2"])])
    );
    assert_eq!(
        t.run(&["zscan", "none", "0", "bogus"]),
        Frame::Array(vec![bulk("0"), arr(&[])])
    );
    assert_eq!(
        t.run(&["zscan", "z", "0", "count", "0"]),
        err("ERR syntax error")
    );
    assert_eq!(t.run(&["zscan", "z", "x"]), err("ERR invalid cursor"));
    // A big set, with runs of members sharing their first 8 bytes.
    let mut members = Vec::new();
    for i in 0..300 {
        members.push(format!("m{i:03}"));
        members.push(format!("longprefix-{i:03}"));
    }
    for (i, m) in members.iter().enumerate() {
        t.run(&["zadd", "big", &i.to_string(), m]);
    }
    let mut cursor = "0".to_string();
    let mut seen = Vec::new();
    let mut calls = 0;
    loop {
        let Frame::Array(r) = t.run(&["zscan", "big", &cursor, "count", "7"]) else {
            panic!()
        };
        let (Frame::Bulk(c), Frame::Array(items)) = (&r[0], &r[1]) else {
            panic!()
        };
        for pair in items.chunks(2) {
            let Frame::Bulk(m) = &pair[0] else { panic!() };
            seen.push(String::from_utf8(m.to_vec()).unwrap());
        }
        calls += 1;
        cursor = String::from_utf8(c.to_vec()).unwrap();
        if cursor == "0" {
            break;
        }
    }
    let mut want = members.clone();
    want.sort();
    assert_eq!(seen, want, "each member exactly once, in member order");
    assert!(calls > 40, "chunked, not whole: {calls} calls");
}
