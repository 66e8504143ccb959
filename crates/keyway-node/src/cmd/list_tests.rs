use super::super::testing::*;
use bytes::Bytes;
use keyway_resp::Frame;
use keyway_storage::Engine;

fn arr(items: &[&str]) -> Frame {
    Frame::Array(items.iter().map(|s| bulk(s)).collect())
}

fn ints(items: &[i64]) -> Frame {
    Frame::Array(items.iter().map(|&i| int(i)).collect())
}

fn all(t: &mut TestDb, key: &str) -> Frame {
    t.run(&["lrange", key, "0", "-1"])
}

/// The sub-entries the engine holds (any key, any version).
fn sub_entries(t: &TestDb) -> usize {
    use keyway_storage::{KeyRange, ValueKind};
    let range = KeyRange {
        start: Bytes::new(),
        end: None,
    };
    t.engine
        .scan(&range, None, usize::MAX)
        .unwrap()
        .entries
        .iter()
        .filter(|(_, v)| v.kind == ValueKind::Sub)
        .count()
}

#[test]
fn push_pop_both_ends_and_empty_lists_vanish() {
    let mut t = TestDb::new();
    assert_eq!(t.run(&["rpush", "l", "a", "b"]), int(2));
    assert_eq!(t.run(&["lpush", "l", "x", "y"]), int(4));
    assert_eq!(all(&mut t, "l"), arr(&["y", "x", "a", "b"]));
    assert_eq!(t.run(&["type", "l"]), Frame::Simple("list".into()));
    assert_eq!(t.run(&["llen", "l"]), int(4));
    assert_eq!(t.run(&["lpop", "l"]), bulk("y"));
    assert_eq!(t.run(&["rpop", "l"]), bulk("b"));
    assert_eq!(t.run(&["rpop", "l", "5"]), arr(&["a", "x"]));
    assert_eq!(t.run(&["exists", "l"]), int(0));
    assert_eq!(t.run(&["lpop", "l"]), Frame::Null);
    assert_eq!(t.run(&["lpop", "l", "2"]), Frame::NullArray);
    assert_eq!(sub_entries(&t), 0, "pops delete their elements");
    assert_eq!(t.run(&["lpushx", "l", "a"]), int(0));
    assert_eq!(t.run(&["exists", "l"]), int(0));
    assert_eq!(t.run(&["rpush", "l", "a"]), int(1));
    assert_eq!(t.run(&["rpushx", "l", "b", "c"]), int(3));
    assert_eq!(t.run(&["lpop", "l", "0"]), Frame::Array(vec![]));
    assert_eq!(
        t.run(&["lpop", "l", "-1"]),
        err("ERR value is out of range, must be positive")
    );
    assert_eq!(
        t.run(&["lpop", "l", "1", "2"]),
        err("ERR wrong number of arguments for 'lpop' command")
    );
}

#[test]
fn wrong_types_and_index_errors_in_redis_order() {
    let mut t = TestDb::new();
    t.run(&["set", "s", "v"]);
    let wrong = err("WRONGTYPE Operation against a key holding the wrong kind of value");
    for cmd in [
        &["lpush", "s", "a"][..],
        &["lpushx", "s", "a"],
        &["lpop", "s"],
        &["llen", "s"],
        &["lindex", "s", "x"],
        &["lset", "s", "x", "v"],
        &["lrange", "s", "0", "1"],
        &["lrem", "s", "0", "a"],
        &["linsert", "s", "before", "a", "b"],
        &["lpos", "s", "a"],
        &["lmove", "s", "d", "left", "left"],
        &["blpop", "nope", "s", "0"],
        &["lmpop", "2", "nope", "s", "left"],
    ] {
        assert_eq!(t.run(cmd), wrong, "{cmd:?}");
    }
    // The index is parsed after the key lookup.
    assert_eq!(t.run(&["lindex", "missing", "x"]), Frame::Null);
    assert_eq!(
        t.run(&["lset", "missing", "x", "v"]),
        err("ERR no such key")
    );
    // LRANGE parses its integers first.
    assert_eq!(
        t.run(&["lrange", "s", "x", "1"]),
        err("ERR value is not an integer or out of range")
    );
    t.run(&["rpush", "l", "a", "b", "c"]);
    assert_eq!(
        t.run(&["lindex", "l", "x"]),
        err("ERR value is not an integer or out of range")
    );
    assert_eq!(
        t.run(&["lset", "l", "3", "v"]),
        err("ERR index out of range")
    );
    assert_eq!(t.run(&["lset", "l", "-3", "v"]), ok());
    assert_eq!(t.run(&["lindex", "l", "0"]), bulk("v"));
    assert_eq!(t.run(&["lindex", "l", "-1"]), bulk("c"));
    assert_eq!(t.run(&["lindex", "l", "3"]), Frame::Null);
    assert_eq!(t.run(&["lindex", "l", "-9223372036854775808"]), Frame::Null);
}

#[test]
fn ranges_and_trims_follow_redis_normalisation() {
    let mut t = TestDb::new();
    t.run(&["rpush", "l", "0", "1", "2", "3", "4", "5"]);
    assert_eq!(t.run(&["lrange", "l", "1", "2"]), arr(&["1", "2"]));
    assert_eq!(t.run(&["lrange", "l", "-2", "100"]), arr(&["4", "5"]));
    assert_eq!(t.run(&["lrange", "l", "-100", "0"]), arr(&["0"]));
    assert_eq!(t.run(&["lrange", "l", "3", "2"]), arr(&[]));
    assert_eq!(t.run(&["lrange", "l", "6", "9"]), arr(&[]));
    assert_eq!(t.run(&["lrange", "missing", "0", "-1"]), arr(&[]));
    assert_eq!(t.run(&["ltrim", "l", "1", "-2"]), ok());
    assert_eq!(all(&mut t, "l"), arr(&["1", "2", "3", "4"]));
    assert_eq!(sub_entries(&t), 4, "trim deletes what it drops");
    assert_eq!(t.run(&["ltrim", "l", "5", "10"]), ok());
    assert_eq!(t.run(&["exists", "l"]), int(0));
    assert_eq!(t.run(&["ltrim", "missing", "0", "1"]), ok());
}

#[test]
fn lrem_and_linsert_rewrite_only_what_changes() {
    let mut t = TestDb::new();
    t.run(&["rpush", "l", "a", "b", "a", "c", "a"]);
    assert_eq!(t.run(&["lrem", "l", "-1", "a"]), int(1));
    assert_eq!(all(&mut t, "l"), arr(&["a", "b", "a", "c"]));
    assert_eq!(t.run(&["lrem", "l", "1", "a"]), int(1));
    assert_eq!(all(&mut t, "l"), arr(&["b", "a", "c"]));
    assert_eq!(t.run(&["lrem", "l", "0", "zz"]), int(0));
    assert_eq!(t.run(&["linsert", "l", "before", "a", "x"]), int(4));
    assert_eq!(t.run(&["linsert", "l", "AFTER", "c", "y"]), int(5));
    assert_eq!(t.run(&["linsert", "l", "before", "b", "z"]), int(6));
    assert_eq!(all(&mut t, "l"), arr(&["z", "b", "x", "a", "c", "y"]));
    assert_eq!(t.run(&["linsert", "l", "before", "nope", "q"]), int(-1));
    assert_eq!(t.run(&["linsert", "missing", "before", "a", "q"]), int(0));
    assert_eq!(
        t.run(&["linsert", "l", "middle", "a", "q"]),
        err("ERR syntax error")
    );
    assert_eq!(t.run(&["lrem", "l", "0", "x"]), int(1));
    assert_eq!(sub_entries(&t), 5);
    assert_eq!(t.run(&["lindex", "l", "2"]), bulk("a"));
    for e in ["z", "b", "a", "c", "y"] {
        t.run(&["lrem", "l", "0", e]);
    }
    assert_eq!(t.run(&["exists", "l"]), int(0));
}

#[test]
fn replace_aligns_to_the_cheaper_end() {
    // Removing the second element of a long list moves one element (the
    // first) rather than all the others.
    let mut t = TestDb::new();
    let elems: Vec<String> = (0..100).map(|i| format!("e{i}")).collect();
    let mut cmd = vec!["rpush", "l"];
    cmd.extend(elems.iter().map(|s| s.as_str()));
    t.run(&cmd);
    let cmd = super::super::parse(&args(&["lrem", "l", "1", "e1"]))
        .unwrap()
        .unwrap();
    let mut db = crate::db::Db::new(&t.engine, &t.ks, t.now, &t.limits);
    assert_eq!(cmd.execute(&mut db).unwrap(), int(1));
    let muts = db.into_mutations();
    assert_eq!(
        muts.len(),
        3,
        "meta, one moved element, one deleted: {muts:?}"
    );
    t.engine.apply(&muts).unwrap();
    assert_eq!(t.run(&["lindex", "l", "0"]), bulk("e0"));
    assert_eq!(t.run(&["lindex", "l", "1"]), bulk("e2"));
    assert_eq!(t.run(&["llen", "l"]), int(99));
}

#[test]
fn lpos_rank_count_maxlen() {
    let mut t = TestDb::new();
    t.run(&["rpush", "l", "a", "b", "c", "1", "2", "3", "c", "c"]);
    assert_eq!(t.run(&["lpos", "l", "c"]), int(2));
    assert_eq!(t.run(&["lpos", "l", "c", "rank", "2"]), int(6));
    assert_eq!(t.run(&["lpos", "l", "c", "rank", "-1"]), int(7));
    assert_eq!(t.run(&["lpos", "l", "c", "count", "0"]), ints(&[2, 6, 7]));
    assert_eq!(
        t.run(&["lpos", "l", "c", "count", "2", "rank", "-1"]),
        ints(&[7, 6])
    );
    assert_eq!(t.run(&["lpos", "l", "c", "maxlen", "2"]), Frame::Null);
    assert_eq!(
        t.run(&["lpos", "l", "c", "count", "0", "maxlen", "7"]),
        ints(&[2, 6])
    );
    assert_eq!(t.run(&["lpos", "l", "zz", "count", "1"]), ints(&[]));
    assert_eq!(t.run(&["lpos", "missing", "a"]), Frame::Null);
    assert_eq!(t.run(&["lpos", "missing", "a", "count", "1"]), ints(&[]));
    assert_eq!(
        t.run(&["lpos", "l", "c", "rank", "0"]),
        err(
            "ERR RANK can't be zero: use 1 to start from the first match, 2 from the second ... or use negative to start from the end of the list"
        )
    );
    assert_eq!(
        t.run(&["lpos", "l", "c", "count", "-1"]),
        err("ERR COUNT can't be negative")
    );
    assert_eq!(
        t.run(&["lpos", "l", "c", "maxlen", "x"]),
        err("ERR MAXLEN can't be negative")
    );
    assert_eq!(t.run(&["lpos", "l", "c", "rank"]), err("ERR syntax error"));
}

#[test]
fn lmove_rpoplpush_and_rotation() {
    let mut t = TestDb::new();
    t.run(&["rpush", "a", "1", "2", "3"]);
    assert_eq!(t.run(&["lmove", "a", "a", "left", "right"]), bulk("1"));
    assert_eq!(all(&mut t, "a"), arr(&["2", "3", "1"]));
    assert_eq!(t.run(&["rpoplpush", "a", "b"]), bulk("1"));
    assert_eq!(t.run(&["lmove", "a", "b", "LEFT", "RIGHT"]), bulk("2"));
    assert_eq!(all(&mut t, "b"), arr(&["1", "2"]));
    assert_eq!(t.run(&["lmove", "a", "b", "left", "left"]), bulk("3"));
    assert_eq!(t.run(&["exists", "a"]), int(0));
    assert_eq!(t.run(&["lmove", "a", "b", "left", "left"]), Frame::Null);
    assert_eq!(
        t.run(&["lmove", "a", "b", "up", "left"]),
        err("ERR syntax error")
    );
    t.run(&["rpush", "one", "x"]);
    assert_eq!(t.run(&["rpoplpush", "one", "one"]), bulk("x"));
    assert_eq!(all(&mut t, "one"), arr(&["x"]));
    t.run(&["set", "s", "v"]);
    assert_eq!(
        t.run(&["lmove", "one", "s", "left", "left"]),
        err("WRONGTYPE Operation against a key holding the wrong kind of value")
    );
    assert_eq!(all(&mut t, "one"), arr(&["x"]), "nothing popped on error");
}

#[test]
fn lmpop_and_the_non_blocking_forms_of_the_blocking_commands() {
    let mut t = TestDb::new();
    t.run(&["rpush", "b", "1", "2", "3"]);
    let reply = |k: &str, items: &[&str]| Frame::Array(vec![bulk(k), arr(items)]);
    assert_eq!(
        t.run(&["lmpop", "2", "a", "b", "right", "count", "2"]),
        reply("b", &["3", "2"])
    );
    assert_eq!(t.run(&["lmpop", "1", "b", "left"]), reply("b", &["1"]));
    assert_eq!(t.run(&["lmpop", "2", "a", "b", "left"]), Frame::NullArray);
    assert_eq!(
        t.run(&["lmpop", "0", "a", "left"]),
        err("ERR numkeys should be greater than 0")
    );
    assert_eq!(t.run(&["lmpop", "3", "a", "left"]), err("ERR syntax error"));
    assert_eq!(
        t.run(&["lmpop", "1", "a", "left", "count", "0"]),
        err("ERR count should be greater than 0")
    );
    assert_eq!(
        t.run(&["lmpop", "1", "a", "left", "count", "1", "count", "1"]),
        err("ERR syntax error")
    );
    t.run(&["rpush", "b", "x", "y"]);
    assert_eq!(
        t.run(&["blpop", "a", "b", "0"]),
        Frame::Array(vec![bulk("b"), bulk("x")])
    );
    assert_eq!(t.run(&["blpop", "a", "0"]), Frame::NullArray);
    assert_eq!(t.run(&["brpop", "a", "-1"]), err("ERR timeout is negative"));
    assert_eq!(
        t.run(&["blmpop", "x", "1", "b", "left"]),
        err("ERR timeout is not a float or out of range")
    );
    assert_eq!(
        t.run(&["blmpop", "0.5", "1", "b", "left"]),
        reply("b", &["y"])
    );
    assert_eq!(
        t.run(&["blmove", "b", "c", "left", "left", "0"]),
        Frame::Null
    );
    assert_eq!(t.run(&["brpoplpush", "b", "c", "0"]), Frame::Null);
}

#[test]
fn blocking_commands_report_their_timeouts_and_keys() {
    let cmd = |a: &[&str]| super::super::parse(&args(a)).unwrap().unwrap();
    assert_eq!(
        cmd(&["blpop", "a", "b", "1.5"]).blocking_timeout_ms(),
        Some(1500)
    );
    assert_eq!(
        cmd(&["blpop", "a", "b", "1.5"]).keys(),
        vec![&b"a"[..], b"b"]
    );
    assert_eq!(
        cmd(&["blmove", "a", "b", "left", "right", "0"]).blocking_timeout_ms(),
        Some(0)
    );
    assert_eq!(
        cmd(&["blmpop", "2", "2", "a", "b", "left"]).keys(),
        vec![&b"a"[..], b"b"]
    );
    assert_eq!(
        cmd(&["lmove", "a", "b", "left", "right"]).blocking_timeout_ms(),
        None
    );
    assert_eq!(cmd(&["lpop", "a"]).blocking_timeout_ms(), None);
    // An invalid blocking command is not blocking: it replies its error.
    assert_eq!(cmd(&["blpop", "a", "x"]).blocking_timeout_ms(), None);
    // LMPOP with a numkeys that names no keys has none to route by.
    assert!(cmd(&["lmpop", "5", "a", "left"]).keys().is_empty());
}

#[test]
fn lists_keep_their_ttl_through_pushes_and_pops() {
    let mut t = TestDb::new();
    t.run(&["rpush", "l", "a", "b"]);
    assert_eq!(t.run(&["expire", "l", "10"]), int(1));
    t.run(&["rpush", "l", "c"]);
    t.run(&["lpop", "l"]);
    assert_eq!(t.run(&["ttl", "l"]), int(10));
    t.advance(10_000);
    assert_eq!(t.run(&["llen", "l"]), int(0));
    assert_eq!(t.run(&["rpush", "l", "z"]), int(1));
    assert_eq!(
        all(&mut t, "l"),
        arr(&["z"]),
        "a new list, not the expired one"
    );
    assert_eq!(t.run(&["ttl", "l"]), int(-1));
}
