//! Tests of `keyspace.rs` (and SORT's parsing, `sort.rs`).

use super::super::testing::*;
use super::object_without_key;
use keyway_resp::Frame;

fn simple(s: &str) -> Frame {
    Frame::Simple(s.into())
}

#[test]
fn rename_moves_value_and_ttl() {
    let mut t = TestDb::new();
    assert_eq!(t.run(&["rename", "a", "b"]), err("ERR no such key"));
    assert_eq!(t.run(&["rename", "a", "a"]), err("ERR no such key"));
    assert_eq!(t.run(&["renamenx", "a", "b"]), err("ERR no such key"));
    t.run(&["set", "a", "1", "ex", "100"]);
    t.run(&["set", "b", "2"]);
    assert_eq!(t.run(&["rename", "a", "a"]), ok());
    assert_eq!(t.run(&["renamenx", "a", "a"]), int(0));
    assert_eq!(t.run(&["renamenx", "a", "b"]), int(0));
    assert_eq!(t.run(&["rename", "a", "b"]), ok());
    assert_eq!(t.run(&["get", "b"]), bulk("1"));
    assert_eq!(t.run(&["ttl", "b"]), int(100));
    assert_eq!(t.run(&["exists", "a"]), int(0));
    assert!(t.stored("a").is_none());
    assert_eq!(t.run(&["renamenx", "b", "c"]), int(1));
    assert_eq!(t.run(&["get", "c"]), bulk("1"));
    // The destination's TTL is not inherited.
    t.run(&["set", "d", "x", "ex", "50"]);
    t.run(&["set", "e", "y"]);
    assert_eq!(t.run(&["rename", "e", "d"]), ok());
    assert_eq!(t.run(&["ttl", "d"]), int(-1));
}

#[test]
fn rename_of_an_expired_key_is_no_such_key() {
    let mut t = TestDb::new();
    t.run(&["set", "a", "1", "px", "10"]);
    t.advance(10);
    assert_eq!(t.run(&["rename", "a", "b"]), err("ERR no such key"));
    assert_eq!(t.run(&["exists", "b"]), int(0));
}

#[test]
fn copy_options_and_replies() {
    let mut t = TestDb::new();
    assert_eq!(t.run(&["copy", "a", "b"]), int(0));
    t.run(&["set", "a", "v", "ex", "100"]);
    assert_eq!(
        t.run(&["copy", "a", "a"]),
        err("ERR source and destination objects are the same")
    );
    assert_eq!(
        t.run(&["copy", "a", "b", "db", "1"]),
        err("ERR Copying to another database is not allowed in cluster mode")
    );
    assert_eq!(
        t.run(&["copy", "a", "b", "db", "16"]),
        err("ERR DB index is out of range")
    );
    assert_eq!(
        t.run(&["copy", "a", "b", "db", "x"]),
        err("ERR value is not an integer or out of range")
    );
    assert_eq!(
        t.run(&["copy", "a", "b", "db", "99999999999"]),
        err("ERR value is out of range, value must between -2147483648 and 2147483647")
    );
    assert_eq!(t.run(&["copy", "a", "b", "db"]), err("ERR syntax error"));
    assert_eq!(t.run(&["copy", "a", "b", "foo"]), err("ERR syntax error"));
    assert_eq!(t.run(&["copy", "a", "b", "DB", "0"]), int(1));
    assert_eq!(t.run(&["get", "b"]), bulk("v"));
    assert_eq!(t.run(&["ttl", "b"]), int(100));
    t.run(&["set", "a", "w"]);
    assert_eq!(t.run(&["copy", "a", "b"]), int(0));
    assert_eq!(t.run(&["copy", "a", "b", "replace"]), int(1));
    assert_eq!(t.run(&["get", "b"]), bulk("w"));
    assert_eq!(t.run(&["ttl", "b"]), int(-1));
}

#[test]
fn touch_counts_live_keys() {
    let mut t = TestDb::new();
    t.run(&["mset", "a", "1", "b", "2"]);
    assert_eq!(t.run(&["touch", "a", "b", "a", "nope"]), int(3));
}

#[test]
fn object_subcommands() {
    let mut t = TestDb::new();
    t.run(&["mset", "i", "12345", "e", "hello", "n", "-0"]);
    t.run(&["set", "r", &"x".repeat(45)]);
    t.run(&["set", "big", "123456789012345678901"]);
    assert_eq!(t.run(&["object", "encoding", "i"]), bulk("int"));
    assert_eq!(t.run(&["object", "encoding", "e"]), bulk("embstr"));
    assert_eq!(t.run(&["object", "encoding", "n"]), bulk("embstr"));
    assert_eq!(t.run(&["object", "encoding", "r"]), bulk("raw"));
    assert_eq!(t.run(&["object", "encoding", "big"]), bulk("embstr"));
    assert_eq!(t.run(&["object", "encoding", "nope"]), Frame::Null);
    t.run(&["set", "small", "42"]);
    assert_eq!(t.run(&["object", "refcount", "small"]), int(2147483647));
    assert_eq!(t.run(&["object", "refcount", "i"]), int(1));
    assert_eq!(t.run(&["object", "refcount", "nope"]), Frame::Null);
    assert_eq!(t.run(&["object", "idletime", "e"]), int(0));
    assert_eq!(t.run(&["object", "freq", "nope"]), Frame::Null);
    assert!(
        matches!(t.run(&["OBJECT", "FREQ", "e"]), Frame::Error(e) if e.starts_with("ERR An LFU maxmemory policy is not selected"))
    );
}

#[test]
fn object_without_a_key_is_answered_unrouted() {
    let a = args;
    assert_eq!(
        object_without_key(&a(&["object"])),
        Some(err("ERR wrong number of arguments for 'object' command"))
    );
    assert_eq!(
        object_without_key(&a(&["object", "encoding"])),
        Some(err(
            "ERR wrong number of arguments for 'object|encoding' command"
        ))
    );
    assert_eq!(
        object_without_key(&a(&["object", "encoding", "a", "b"])),
        Some(err(
            "ERR wrong number of arguments for 'object|encoding' command"
        ))
    );
    assert_eq!(
        object_without_key(&a(&["object", "foo", "x"])),
        Some(err("ERR unknown subcommand 'foo'. Try OBJECT HELP."))
    );
    assert_eq!(object_without_key(&a(&["object", "Encoding", "k"])), None);
    assert_eq!(
        object_without_key(&a(&["object", "help", "x"])),
        Some(err(
            "ERR wrong number of arguments for 'object|help' command"
        ))
    );
    let Some(Frame::Array(help)) = object_without_key(&a(&["object", "help"])) else {
        panic!("help is an array");
    };
    assert_eq!(help.len(), 15);
    assert_eq!(help[14], simple("    Prints this help."));
}

#[test]
fn substr_is_getrange() {
    let mut t = TestDb::new();
    t.run(&["set", "k", "Hello World"]);
    assert_eq!(t.run(&["substr", "k", "0", "4"]), bulk("Hello"));
    assert_eq!(t.run(&["substr", "k", "-5", "-1"]), bulk("World"));
    assert_eq!(t.run(&["substr", "nope", "0", "-1"]), bulk(""));
    assert_eq!(
        t.run(&["substr", "k", "a", "1"]),
        err("ERR value is not an integer or out of range")
    );
}

#[test]
fn sort_options_in_cluster_mode() {
    let mut t = TestDb::new();
    assert_eq!(
        t.run(&["sort", "l", "by", "w_*"]),
        err("ERR BY option of SORT denied in Cluster mode.")
    );
    assert_eq!(
        t.run(&["sort", "l", "get", "#"]),
        err("ERR GET option of SORT denied in Cluster mode.")
    );
    assert_eq!(t.run(&["sort", "l", "limit", "0"]), err("ERR syntax error"));
    assert_eq!(
        t.run(&["sort", "l", "limit", "a", "1"]),
        err("ERR value is not an integer or out of range")
    );
    assert_eq!(
        t.run(&["sort_ro", "l", "store", "d"]),
        err("ERR syntax error")
    );
    assert_eq!(t.run(&["sort", "l", "by", "nosort"]), Frame::Array(vec![]));
    assert_eq!(t.run(&["sort", "l", "store", "d"]), int(0));
    t.run(&["set", "s", "x"]);
    assert_eq!(
        t.run(&["sort", "s"]),
        err("WRONGTYPE Operation against a key holding the wrong kind of value")
    );
}
