use super::super::testing::*;
use keyway_resp::Frame;

fn arr(items: &[&str]) -> Frame {
    Frame::Array(items.iter().map(|s| bulk(s)).collect())
}

#[test]
fn set_get_len_del_and_the_empty_hash_is_deleted() {
    let mut t = TestDb::new();
    assert_eq!(t.run(&["hset", "h", "a", "1", "b", "2"]), int(2));
    assert_eq!(t.run(&["hset", "h", "a", "9", "c", "3"]), int(1));
    assert_eq!(t.run(&["hget", "h", "a"]), bulk("9"));
    assert_eq!(t.run(&["hget", "h", "zz"]), Frame::Null);
    assert_eq!(t.run(&["hlen", "h"]), int(3));
    assert_eq!(t.run(&["hkeys", "h"]), arr(&["a", "b", "c"]));
    assert_eq!(
        t.run(&["hmget", "h", "a", "x", "c"]),
        Frame::Array(vec![bulk("9"), Frame::Null, bulk("3")])
    );
    assert_eq!(t.run(&["type", "h"]), Frame::Simple("hash".into()));
    assert_eq!(t.run(&["hdel", "h", "a", "b", "c", "nope"]), int(3));
    assert_eq!(t.run(&["exists", "h"]), int(0));
    assert!(t.stored("h").is_none());
}

#[test]
fn wrong_types_both_ways() {
    let mut t = TestDb::new();
    t.run(&["set", "s", "v"]);
    t.run(&["hset", "h", "f", "v"]);
    let wt = err("WRONGTYPE Operation against a key holding the wrong kind of value");
    assert_eq!(t.run(&["hget", "s", "f"]), wt);
    assert_eq!(t.run(&["hset", "s", "f", "v"]), wt);
    assert_eq!(t.run(&["get", "h"]), wt);
    assert_eq!(t.run(&["append", "h", "x"]), wt);
    // SET overwrites any type; the old fields are invisible to the new hash.
    assert_eq!(t.run(&["set", "h", "str"]), ok());
    assert_eq!(t.run(&["get", "h"]), bulk("str"));
    assert_eq!(t.run(&["hset", "h2", "x", "1"]), int(1));
    t.run(&["del", "h2"]);
    assert_eq!(t.run(&["hset", "h2", "y", "2"]), int(1));
    assert_eq!(
        t.run(&["hgetall", "h2"]),
        Frame::Map(vec![(bulk("y"), bulk("2"))])
    );
}

#[test]
fn incr_and_errors_in_redis_order() {
    let mut t = TestDb::new();
    assert_eq!(t.run(&["hincrby", "h", "n", "5"]), int(5));
    assert_eq!(t.run(&["hincrby", "h", "n", "-7"]), int(-2));
    assert_eq!(
        t.run(&["hincrby", "h", "n", "x"]),
        err("ERR value is not an integer or out of range")
    );
    t.run(&["hset", "h", "s", "abc"]);
    assert_eq!(
        t.run(&["hincrby", "h", "s", "1"]),
        err("ERR hash value is not an integer")
    );
    assert_eq!(
        t.run(&["hincrbyfloat", "h", "s", "1"]),
        err("ERR hash value is not a float")
    );
    assert_eq!(t.run(&["hincrbyfloat", "h", "f", "1.5"]), bulk("1.5"));
    assert_eq!(
        t.run(&["hincrbyfloat", "h", "f", "inf"]),
        err("ERR value is NaN or Infinity")
    );
    t.run(&["hset", "h", "m", "9223372036854775807"]);
    assert_eq!(
        t.run(&["hincrby", "h", "m", "1"]),
        err("ERR increment or decrement would overflow")
    );
    assert_eq!(
        t.run(&["hset", "h", "odd"]),
        err("ERR wrong number of arguments for 'hset' command")
    );
}

#[test]
fn a_ttl_survives_field_writes_and_expiry_hides_the_fields() {
    let mut t = TestDb::new();
    t.run(&["hset", "h", "a", "1"]);
    assert_eq!(t.run(&["pexpire", "h", "1000"]), int(1));
    t.run(&["hset", "h", "b", "2"]);
    assert_eq!(t.run(&["pttl", "h"]), int(1000));
    t.advance(1000);
    assert_eq!(t.run(&["hlen", "h"]), int(0));
    assert_eq!(t.run(&["hset", "h", "c", "3"]), int(1));
    assert_eq!(t.run(&["hkeys", "h"]), arr(&["c"]));
    assert_eq!(t.run(&["ttl", "h"]), int(-1));
}

fn full_hscan(t: &mut TestDb) -> (usize, usize) {
    let mut cursor = "0".to_string();
    let mut seen = std::collections::BTreeSet::new();
    let mut calls = 0;
    loop {
        calls += 1;
        let Frame::Array(reply) = t.run(&["hscan", "h", &cursor, "count", "20"]) else {
            panic!("not an array")
        };
        let (Frame::Bulk(c), Frame::Array(items)) = (&reply[0], &reply[1]) else {
            panic!()
        };
        for pair in items.chunks(2) {
            seen.insert(format!("{:?}", pair[0]));
        }
        cursor = String::from_utf8(c.to_vec()).unwrap();
        if cursor == "0" {
            return (seen.len(), calls);
        }
        assert!(calls < 5000, "no progress");
    }
}

#[test]
fn hscan_without_a_cursor_table_still_ends_and_misses_nothing() {
    let mut t = TestDb::new();
    t.cursors = None;
    for i in 0..300 {
        let f = if i % 2 == 0 {
            format!("f{i}")
        } else {
            format!("long-shared-prefix:{i}")
        };
        t.run(&["hset", "h", &f, "v"]);
    }
    let (seen, calls) = full_hscan(&mut t);
    assert_eq!(seen, 300);
    assert!(calls > 2, "short fields chunk: {calls} calls");
    // A table cursor unknown to this node restarts: nothing missed.
    let (seen, _) = {
        t.cursors = Some(std::sync::Mutex::new(crate::scan::ScanCursors::new(4)));
        let Frame::Array(r) = t.run(&[
            "hscan",
            "h",
            &(1u64 << 63 | 12345).to_string(),
            "count",
            "1000",
        ]) else {
            panic!()
        };
        let Frame::Array(items) = &r[1] else { panic!() };
        (items.len() / 2, ())
    };
    assert_eq!(seen, 300);
}

#[test]
fn hscan_returns_every_field_once_per_pass_in_chunks() {
    let mut t = TestDb::new();
    let mut cmd = vec!["hset".to_string(), "h".to_string()];
    for i in 0..500 {
        cmd.push(format!("field:{i:05}"));
        cmd.push(i.to_string());
    }
    let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
    assert_eq!(t.run(&cmd), int(500));
    let mut cursor = "0".to_string();
    let mut seen = std::collections::BTreeSet::new();
    let mut calls = 0;
    loop {
        calls += 1;
        let Frame::Array(reply) = t.run(&["hscan", "h", &cursor, "count", "20"]) else {
            panic!("not an array")
        };
        let Frame::Bulk(c) = &reply[0] else { panic!() };
        let Frame::Array(items) = &reply[1] else {
            panic!()
        };
        for pair in items.chunks(2) {
            let Frame::Bulk(f) = &pair[0] else { panic!() };
            seen.insert(f.clone());
        }
        cursor = String::from_utf8(c.to_vec()).unwrap();
        if cursor == "0" {
            break;
        }
        assert!(calls < 500, "no progress");
    }
    assert_eq!(seen.len(), 500);
    assert!(calls >= 10, "chunked: {calls} calls");
    assert_eq!(
        t.run(&["hscan", "nope", "0", "bogus"]),
        Frame::Array(vec![bulk("0"), Frame::Array(vec![])])
    );
    assert_eq!(t.run(&["hscan", "h", "x"]), err("ERR invalid cursor"));
    assert_eq!(
        t.run(&["hscan", "h", "0", "count", "0"]),
        err("ERR syntax error")
    );
    let Frame::Array(r) = t.run(&["hscan", "h", "0", "match", "field:0000*", "count", "1000"])
    else {
        panic!()
    };
    assert_eq!(
        r[1],
        Frame::Array(vec![
            bulk("field:00000"),
            bulk("0"),
            bulk("field:00001"),
            bulk("1"),
            bulk("field:00002"),
            bulk("2"),
            bulk("field:00003"),
            bulk("3"),
            bulk("field:00004"),
            bulk("4"),
            bulk("field:00005"),
            bulk("5"),
            bulk("field:00006"),
            bulk("6"),
            bulk("field:00007"),
            bulk("7"),
            bulk("field:00008"),
            bulk("8"),
            bulk("field:00009"),
            bulk("9")
        ])
    );
}

#[test]
fn hrandfield_counts() {
    let mut t = TestDb::new();
    assert_eq!(t.run(&["hrandfield", "h"]), Frame::Null);
    assert_eq!(t.run(&["hrandfield", "h", "3"]), Frame::Array(vec![]));
    t.run(&["hset", "h", "a", "1", "b", "2", "c", "3"]);
    let Frame::Array(v) = t.run(&["hrandfield", "h", "10"]) else {
        panic!()
    };
    assert_eq!(v.len(), 3);
    let Frame::Pairs(v) = t.run(&["hrandfield", "h", "-10", "withvalues"]) else {
        panic!()
    };
    assert_eq!(v.len(), 10);
    assert_eq!(
        t.run(&["hrandfield", "h", "1", "x"]),
        err("ERR syntax error")
    );
    assert_eq!(t.run(&["hrandfield", "h", "0"]), Frame::Array(vec![]));
}

#[test]
fn small_hashes_answer_in_insertion_order_big_ones_in_field_order() {
    let mut t = TestDb::new();
    t.run(&["hset", "h", "z", "1", "a", "2", "m", "3"]);
    // An overwrite keeps its place; a field deleted and set again goes last.
    t.run(&["hset", "h", "a", "9"]);
    t.run(&["hincrby", "h", "m", "1"]);
    t.run(&["hdel", "h", "z"]);
    t.run(&["hset", "h", "z", "4"]);
    assert_eq!(t.run(&["hkeys", "h"]), arr(&["a", "m", "z"]));
    assert_eq!(t.run(&["hvals", "h"]), arr(&["9", "4", "4"]));
    // DUMP/RESTORE and COPY keep the order.
    let Frame::Bulk(dump) = t.run(&["dump", "h"]) else {
        panic!("dump")
    };
    let restore: [bytes::Bytes; 3] = ["restore", "h2", "0"].map(bytes::Bytes::from);
    let mut restore = restore.to_vec();
    restore.push(dump);
    assert_eq!(t.run_args(&restore), ok());
    assert_eq!(t.run(&["hkeys", "h2"]), arr(&["a", "m", "z"]));
    t.run(&["copy", "h", "h3"]);
    assert_eq!(t.run(&["hkeys", "h3"]), arr(&["a", "m", "z"]));

    let n = crate::coll::HASH_INSERTION_ORDER_MAX_FIELDS + 1;
    let fields: Vec<String> = (0..n).rev().map(|i| format!("f{i:04}")).collect();
    for f in &fields {
        t.run(&["hset", "big", f, "v"]);
    }
    let mut sorted = fields.clone();
    sorted.sort();
    let sorted: Vec<&str> = sorted.iter().map(|s| s.as_str()).collect();
    assert_eq!(t.run(&["hkeys", "big"]), arr(&sorted));
    t.run(&["hdel", "big", "f0000"]);
    let rev: Vec<&str> = fields[..fields.len() - 1]
        .iter()
        .map(|s| s.as_str())
        .collect();
    assert_eq!(
        t.run(&["hkeys", "big"]),
        arr(&rev),
        "back to insertion order"
    );
}
