//! Stream command tests on a [`TestDb`] (the clock-dependent parts: `*`
//! ids, idle and seen times, which the differential test cannot compare;
//! the layout; COPY / RENAME / DUMP of a stream).

use super::super::testing::*;
use keyway_resp::Frame;
use keyway_storage::ValueKind;

fn arr(items: Vec<Frame>) -> Frame {
    Frame::Array(items)
}

fn entry(id: &str, fields: &[&str]) -> Frame {
    arr(vec![
        bulk(id),
        arr(fields.iter().map(|f| bulk(f)).collect()),
    ])
}

/// The value after `name` in a flat map reply.
fn field(reply: &Frame, name: &str) -> Frame {
    match reply {
        Frame::Map(pairs) => pairs
            .iter()
            .find(|(k, _)| *k == bulk(name))
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no {name} in {reply:?}")),
        other => panic!("not a map: {other:?}"),
    }
}

#[test]
fn star_ids_follow_the_command_clock_and_never_go_back() {
    let mut t = TestDb::new();
    assert_eq!(
        t.run(&["xadd", "s", "*", "a", "1"]),
        bulk(&format!("{T0}-0"))
    );
    assert_eq!(
        t.run(&["xadd", "s", "*", "a", "2"]),
        bulk(&format!("{T0}-1"))
    );
    t.advance(5);
    let later = T0 + 5;
    assert_eq!(
        t.run(&["xadd", "s", "*", "a", "3"]),
        bulk(&format!("{later}-0"))
    );
    // An explicit id in the future: `*` goes on from it, not from the clock.
    let future = T0 + 1000;
    assert_eq!(
        t.run(&["xadd", "s", &format!("{future}-7"), "a", "4"]),
        bulk(&format!("{future}-7"))
    );
    assert_eq!(
        t.run(&["xadd", "s", "*", "a", "5"]),
        bulk(&format!("{future}-8"))
    );
    assert_eq!(
        t.run(&["xadd", "s", &format!("{future}-*"), "a", "6"]),
        bulk(&format!("{future}-9"))
    );
    assert_eq!(t.run(&["xlen", "s"]), int(6));
    assert_eq!(t.run(&["type", "s"]), Frame::Simple("stream".into()));
    assert_eq!(t.run(&["object", "encoding", "s"]), bulk("stream"));
    assert_eq!(t.stored("s").unwrap().kind, ValueKind::Stream);
}

#[test]
fn an_emptied_stream_stays_with_its_ids_and_del_removes_it() {
    let mut t = TestDb::new();
    t.run(&["xadd", "s", "1-1", "f", "v"]);
    assert_eq!(t.run(&["xdel", "s", "1-1"]), int(1));
    assert_eq!(t.run(&["exists", "s"]), int(1));
    assert_eq!(t.run(&["xlen", "s"]), int(0));
    let info = t.run(&["xinfo", "stream", "s"]);
    assert_eq!(field(&info, "last-generated-id"), bulk("1-1"));
    assert_eq!(field(&info, "max-deleted-entry-id"), bulk("1-1"));
    assert_eq!(field(&info, "recorded-first-entry-id"), bulk("0-0"));
    assert_eq!(field(&info, "first-entry"), Frame::Null);
    assert_eq!(
        t.run(&["xadd", "s", "1-1", "f", "v"]),
        err("ERR The ID specified in XADD is equal or smaller than the target stream top item")
    );
    assert_eq!(t.run(&["del", "s"]), int(1));
    assert_eq!(t.run(&["exists", "s"]), int(0));
    // A new incarnation starts from 0-0.
    assert_eq!(t.run(&["xadd", "s", "1-1", "f", "v"]), bulk("1-1"));
    assert_eq!(
        t.run(&["xgroup", "create", "e", "g", "$", "mkstream"]),
        ok()
    );
    assert_eq!(t.run(&["exists", "e"]), int(1));
}

#[test]
fn idle_and_seen_times_use_the_node_clock() {
    let mut t = TestDb::new();
    t.run(&["xadd", "s", "1-0", "f", "v"]);
    t.run(&["xadd", "s", "2-0", "f", "w"]);
    t.run(&["xgroup", "create", "s", "g", "0"]);
    assert_eq!(
        t.run(&[
            "xreadgroup",
            "group",
            "g",
            "alice",
            "count",
            "1",
            "streams",
            "s",
            ">"
        ]),
        arr(vec![arr(vec![
            bulk("s"),
            arr(vec![entry("1-0", &["f", "v"])])
        ])])
    );
    t.advance(250);
    assert_eq!(
        t.run(&["xpending", "s", "g", "-", "+", "10"]),
        arr(vec![arr(vec![
            bulk("1-0"),
            bulk("alice"),
            int(250),
            int(1)
        ])])
    );
    assert_eq!(
        t.run(&["xpending", "s", "g", "idle", "300", "-", "+", "10"]),
        arr(vec![])
    );
    assert_eq!(
        t.run(&["xinfo", "consumers", "s", "g"]),
        arr(vec![Frame::Map(vec![
            (bulk("name"), bulk("alice")),
            (bulk("pending"), int(1)),
            (bulk("idle"), int(250)),
        ])])
    );
    // Not idle long enough for bob; then it is.
    assert_eq!(
        t.run(&["xclaim", "s", "g", "bob", "300", "1-0"]),
        arr(vec![])
    );
    t.advance(100);
    assert_eq!(
        t.run(&["xclaim", "s", "g", "bob", "300", "1-0"]),
        arr(vec![entry("1-0", &["f", "v"])])
    );
    assert_eq!(
        t.run(&["xpending", "s", "g", "-", "+", "10", "bob"]),
        arr(vec![arr(vec![bulk("1-0"), bulk("bob"), int(0), int(2)])])
    );
    // XCLAIM IDLE sets the delivery time back.
    t.run(&[
        "xclaim", "s", "g", "bob", "0", "1-0", "idle", "5000", "justid",
    ]);
    assert_eq!(
        t.run(&["xautoclaim", "s", "g", "carol", "4000", "0", "justid"]),
        arr(vec![bulk("0-0"), arr(vec![bulk("1-0")]), arr(vec![])])
    );
    let full = t.run(&["xinfo", "stream", "s", "full"]);
    let Frame::Array(groups) = field(&full, "groups") else {
        panic!("groups")
    };
    let consumers = field(&groups[0], "consumers");
    let Frame::Array(consumers) = consumers else {
        panic!("consumers")
    };
    let now = (T0 + 350) as i64;
    let seen: Vec<Frame> = consumers.iter().map(|c| field(c, "seen-time")).collect();
    assert_eq!(seen, vec![int(now - 350), int(now), int(now)]);
}

#[test]
fn copy_and_rename_carry_groups_pending_entries_and_consumers() {
    let mut t = TestDb::new();
    for id in ["100", "101", "102", "103"] {
        t.run(&["xadd", "x", id, "a", id]);
    }
    t.run(&["xgroup", "create", "x", "g1", "0"]);
    t.run(&["xgroup", "create", "x", "g2", "$"]);
    t.run(&[
        "xreadgroup",
        "group",
        "g1",
        "alice",
        "count",
        "2",
        "streams",
        "x",
        ">",
    ]);
    t.run(&["xgroup", "createconsumer", "x", "g2", "bob"]);
    t.run(&["xdel", "x", "101"]);
    t.run(&["pexpire", "x", "100000"]);
    let info = t.run(&["xinfo", "stream", "x", "full"]);
    assert_eq!(t.run(&["copy", "x", "y"]), int(1));
    assert_eq!(t.run(&["xinfo", "stream", "y", "full"]), info);
    assert_eq!(t.run(&["pttl", "y"]), int(100000));
    // The copy is independent.
    t.run(&["xack", "y", "g1", "100"]);
    assert_eq!(t.run(&["xinfo", "stream", "x", "full"]), info);
    assert_eq!(t.run(&["rename", "x", "z"]), ok());
    assert_eq!(t.run(&["exists", "x"]), int(0));
    assert_eq!(t.run(&["xinfo", "stream", "z", "full"]), info);
    // Destroying a group removes its pending entries and consumers.
    assert_eq!(t.run(&["xgroup", "destroy", "z", "g1"]), int(1));
    t.run(&["xgroup", "create", "z", "g1", "0"]);
    assert_eq!(
        t.run(&["xpending", "z", "g1"]),
        arr(vec![int(0), Frame::Null, Frame::Null, Frame::NullArray])
    );
    assert_eq!(t.run(&["xinfo", "consumers", "z", "g1"]), arr(vec![]));
}

#[test]
fn dump_of_a_stream_is_a_clear_error_and_sort_is_wrongtype() {
    let mut t = TestDb::new();
    t.run(&["xadd", "s", "1", "f", "v"]);
    assert_eq!(
        t.run(&["dump", "s"]),
        err("ERR DUMP of a stream is not supported by Keyway")
    );
    assert_eq!(
        t.run(&["sort", "s"]),
        err("WRONGTYPE Operation against a key holding the wrong kind of value")
    );
    assert_eq!(
        t.run(&["lpush", "s", "x"]),
        err("WRONGTYPE Operation against a key holding the wrong kind of value")
    );
}

#[test]
fn containers_answer_help_and_subcommand_errors_without_a_key() {
    let mut t = TestDb::new();
    assert_eq!(
        t.run(&["xgroup", "foo"]),
        err("ERR unknown subcommand 'foo'. Try XGROUP HELP.")
    );
    assert_eq!(
        t.run(&["xgroup", "create", "k"]),
        err("ERR wrong number of arguments for 'xgroup|create' command")
    );
    assert_eq!(
        t.run(&["xinfo", "stream"]),
        err("ERR wrong number of arguments for 'xinfo|stream' command")
    );
    let Frame::Array(lines) = t.run(&["xinfo", "help"]) else {
        panic!("help")
    };
    assert_eq!(lines.len(), 9);
    let cmd = super::super::parse(&args(&["xgroup", "create", "k", "g", "$"]))
        .unwrap()
        .unwrap();
    assert!(cmd.is_write());
    assert_eq!(cmd.keys(), vec![&b"k"[..]]);
    let cmd = super::super::parse(&args(&[
        "xread", "count", "1", "block", "10", "streams", "a", "b", "0", "0",
    ]))
    .unwrap()
    .unwrap();
    assert_eq!(cmd.keys(), vec![&b"a"[..], &b"b"[..]]);
    assert_eq!(cmd.blocking_timeout_ms(), Some(10));
}

#[test]
fn a_blocked_xread_keeps_the_dollar_it_resolved_first() {
    let mut t = TestDb::new();
    t.run(&["xadd", "s", "1-0", "f", "v"]);
    let cmd = super::super::parse(&args(&["xread", "block", "0", "streams", "s", "$"]))
        .unwrap()
        .unwrap();
    let attempt = |t: &mut TestDb| {
        let mut db = crate::db::Db::new(&t.engine, &t.ks, t.now, &t.limits);
        cmd.clone().execute(&mut db).expect("storage")
    };
    // First attempt: nothing after 1-0 (the client would block).
    assert_eq!(attempt(&mut t), Frame::NullArray);
    t.run(&["xadd", "s", "2-0", "f", "w"]);
    // The next attempt (a clone, as the blocking machinery makes) serves 2-0.
    assert_eq!(
        attempt(&mut t),
        arr(vec![arr(vec![
            bulk("s"),
            arr(vec![entry("2-0", &["f", "w"])])
        ])])
    );
}

#[test]
fn approximate_trimming_removes_whole_nodes_of_100_appends() {
    let mut t = TestDb::new();
    for i in 1..=250 {
        t.run(&["xadd", "s", &format!("{i}-0"), "f", "v"]);
    }
    assert_eq!(t.run(&["xtrim", "s", "maxlen", "~", "120"]), int(100));
    assert_eq!(t.run(&["xlen", "s"]), int(150));
    assert_eq!(t.run(&["xtrim", "s", "maxlen", "~", "120"]), int(0));
    assert_eq!(t.run(&["xtrim", "s", "maxlen", "=", "120"]), int(30));
    // The rest of the second node (131..200) goes whole; the tail node
    // (201..250) holds 250 itself.
    assert_eq!(t.run(&["xtrim", "s", "minid", "~", "250"]), int(70));
    assert_eq!(t.run(&["xlen", "s"]), int(50));
    assert_eq!(
        t.run(&["xrange", "s", "-", "+", "count", "1"]),
        arr(vec![entry("201-0", &["f", "v"])])
    );
    // Emptied by XDEL, the tail node is gone: the next append opens a new
    // one, which MAXLEN ~ then keeps whole.
    for i in 201..=250 {
        t.run(&["xdel", "s", &format!("{i}-0")]);
    }
    for i in 300..310 {
        t.run(&["xadd", "s", &format!("{i}-0"), "f", "v"]);
    }
    assert_eq!(t.run(&["xtrim", "s", "maxlen", "~", "5"]), int(0));
    assert_eq!(t.run(&["xtrim", "s", "maxlen", "~", "0"]), int(10));
    assert_eq!(
        t.run(&["xtrim", "s", "maxlen", "1", "limit", "5"]),
        err("ERR syntax error, LIMIT cannot be used without the special ~ option")
    );
}
