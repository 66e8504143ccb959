use super::super::testing::*;
use keyway_resp::Frame;

fn set(items: &[&str]) -> Frame {
    Frame::Set(items.iter().map(|s| bulk(s)).collect())
}

#[test]
fn add_remove_card_members_and_the_empty_set_is_deleted() {
    let mut t = TestDb::new();
    assert_eq!(t.run(&["sadd", "s", "b", "a", "b"]), int(2));
    assert_eq!(t.run(&["sadd", "s", "c"]), int(1));
    assert_eq!(t.run(&["scard", "s"]), int(3));
    assert_eq!(t.run(&["smembers", "s"]), set(&["a", "b", "c"]));
    assert_eq!(t.run(&["sismember", "s", "a"]), int(1));
    assert_eq!(
        t.run(&["smismember", "s", "a", "z"]),
        Frame::Array(vec![int(1), int(0)])
    );
    assert_eq!(t.run(&["type", "s"]), Frame::Simple("set".into()));
    assert_eq!(t.run(&["srem", "s", "a", "b", "c", "z"]), int(3));
    assert_eq!(t.run(&["exists", "s"]), int(0));
}

#[test]
fn algebra_and_store_forms() {
    let mut t = TestDb::new();
    t.run(&["sadd", "{t}a", "1", "2", "3"]);
    t.run(&["sadd", "{t}b", "2", "3", "4"]);
    assert_eq!(t.run(&["sinter", "{t}a", "{t}b"]), set(&["2", "3"]));
    assert_eq!(
        t.run(&["sunion", "{t}a", "{t}b", "{t}none"]),
        set(&["1", "2", "3", "4"])
    );
    assert_eq!(t.run(&["sdiff", "{t}a", "{t}b"]), set(&["1"]));
    assert_eq!(t.run(&["sinter", "{t}a", "{t}none"]), set(&[]));
    t.run(&["set", "{t}str", "x"]);
    let wt = err("WRONGTYPE Operation against a key holding the wrong kind of value");
    assert_eq!(t.run(&["sinter", "{t}none", "{t}str"]), wt);
    assert_eq!(t.run(&["sinterstore", "{t}str", "{t}a", "{t}b"]), int(2));
    assert_eq!(t.run(&["smembers", "{t}str"]), set(&["2", "3"]));
    assert_eq!(t.run(&["sdiffstore", "{t}str", "{t}a", "{t}a"]), int(0));
    assert_eq!(t.run(&["exists", "{t}str"]), int(0));
    assert_eq!(
        t.run(&["sintercard", "2", "{t}a", "{t}b", "limit", "1"]),
        int(1)
    );
    assert_eq!(
        t.run(&["sintercard", "0", "{t}a"]),
        err("ERR numkeys should be greater than 0")
    );
    assert_eq!(
        t.run(&["sintercard", "3", "{t}a"]),
        err("ERR Number of keys can't be greater than number of args")
    );
    assert_eq!(
        t.run(&["sintercard", "1", "{t}a", "limit", "-1"]),
        err("ERR LIMIT can't be negative")
    );
}

#[test]
fn smove_spop_srandmember() {
    let mut t = TestDb::new();
    t.run(&["sadd", "{t}a", "x", "y"]);
    assert_eq!(t.run(&["smove", "{t}a", "{t}b", "x"]), int(1));
    assert_eq!(t.run(&["smove", "{t}a", "{t}b", "x"]), int(0));
    assert_eq!(t.run(&["smove", "{t}a", "{t}a", "y"]), int(1));
    assert_eq!(t.run(&["smembers", "{t}b"]), set(&["x"]));
    assert_eq!(t.run(&["smove", "{t}a", "{t}b", "y"]), int(1));
    assert_eq!(t.run(&["exists", "{t}a"]), int(0));
    let Frame::Set(popped) = t.run(&["spop", "{t}b", "5"]) else {
        panic!()
    };
    assert_eq!(popped.len(), 2);
    assert_eq!(t.run(&["exists", "{t}b"]), int(0));
    assert_eq!(t.run(&["spop", "{t}b"]), Frame::Null);
    assert_eq!(
        t.run(&["spop", "{t}b", "-1"]),
        err("ERR value is out of range, must be positive")
    );
    t.run(&["sadd", "s", "1", "2", "3"]);
    let Frame::Array(r) = t.run(&["srandmember", "s", "-7"]) else {
        panic!()
    };
    assert_eq!(r.len(), 7);
    let Frame::Array(r) = t.run(&["srandmember", "s", "7"]) else {
        panic!()
    };
    assert_eq!(r.len(), 3);
    assert_eq!(
        t.run(&["srandmember", "s", "1", "2"]),
        err("ERR syntax error")
    );
}

#[test]
fn writes_that_change_nothing_write_nothing() {
    let mut t = TestDb::new();
    t.run(&["sadd", "{t}a", "x", "y"]);
    t.run(&["sadd", "{t}b", "x"]);
    let version = t.stored("{t}b").unwrap().version;
    assert_eq!(t.run(&["sadd", "{t}b", "x"]), int(0));
    assert_eq!(t.run(&["smove", "{t}a", "{t}b", "x"]), int(1));
    assert_eq!(
        t.stored("{t}b").unwrap().version,
        version,
        "the destination was not rewritten"
    );
    assert_eq!(t.run(&["scard", "{t}a"]), int(1));
}
